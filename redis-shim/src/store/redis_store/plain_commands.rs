//! What the replication between regions (`crate::store::regions`) asks of a
//! [`RedisStore`] besides the checks: the function library, one of its functions called
//! as it is, and plain commands, alone or pipelined, within the store's timeout.

use super::RedisStore;
use crate::store::redis_connection::Connection;
use crate::store::scripts::{FunctionCall, Library};
use crate::store::StoreError;
use redis::aio::ConnectionManager;
use redis::{Cmd, FromRedisValue, Pipeline};

impl RedisStore {
    pub(crate) fn library(&self) -> &Library {
        &self.library
    }

    /// Calls one of the library's functions (regions' calls: `crate::store::regions`).
    pub(crate) async fn call_function<T: FromRedisValue + Send>(
        &self,
        call: &FunctionCall<'_>,
    ) -> Result<T, StoreError> {
        self.invoke(call).await
    }

    /// One plain command (a standalone Redis), within the Redis timeout: what the
    /// replication between regions reads and writes besides its function.
    pub(crate) async fn command<T: FromRedisValue + Send>(&self, command: &Cmd) -> Result<T, StoreError> {
        let (mut manager, generation) = self.standalone()?;
        self.bounded(generation, self.config.timeout, command.query_async(&mut manager))
            .await
    }

    /// Several plain commands in one round trip (a standalone Redis), within the Redis
    /// timeout.
    pub(crate) async fn pipeline<T: FromRedisValue + Send>(
        &self,
        pipeline: &Pipeline,
    ) -> Result<T, StoreError> {
        let (mut manager, generation) = self.standalone()?;
        self.bounded(
            generation,
            self.config.timeout,
            pipeline.query_async(&mut manager),
        )
        .await
    }

    /// The standalone connection and its generation; regions run on no other.
    fn standalone(&self) -> Result<(ConnectionManager, u64), StoreError> {
        match self.connection() {
            (Connection::Standalone(manager), generation) => Ok((manager, generation)),
            (Connection::Cluster(_), _) => Err(StoreError::Unsupported(
                "regions run on a standalone Redis".into(),
            )),
        }
    }
}
