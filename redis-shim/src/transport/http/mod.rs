//! The HTTP endpoints the filter calls, and the template every HTTP endpoint goes
//! through: [`endpoint`] (token, in-flight permit, the body read within its limits by
//! `body`, the answer counted), `check` (`POST /v1/check`) and `check_batch`
//! (`POST /v1/check-batch`).

mod body;
pub(crate) mod check;
pub(crate) mod check_batch;
pub mod endpoint;
