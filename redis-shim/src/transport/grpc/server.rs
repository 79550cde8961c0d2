//! The two gRPC services as tonic serves them: each routes its one method's path to the
//! shim's service ([`RlsService`], [`RlqsService`]) through tonic's protobuf codec, and
//! answers any other path `UNIMPLEMENTED`, as a generated server would.

use crate::envoy_api::messages::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::envoy_api::messages::ratelimit::{RateLimitRequest, RateLimitResponse};
use crate::transport::grpc::rlqs::{QuotaStream, RlqsService};
use crate::transport::grpc::rls::RlsService;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body as GrpcBody;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

/// `envoy.service.ratelimit.v3.RateLimitService`.
#[derive(Clone)]
pub struct RateLimitServer(pub Arc<RlsService>);

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`.
#[derive(Clone)]
pub struct RateLimitQuotaServer(pub Arc<RlqsService>);

impl NamedService for RateLimitServer {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl NamedService for RateLimitQuotaServer {
    const NAME: &'static str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
}

impl UnaryService<RateLimitRequest> for RateLimitServer {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.should_rate_limit(request).await })
    }
}

impl StreamingService<RateLimitQuotaUsageReports> for RateLimitQuotaServer {
    type Response = RateLimitQuotaResponse;
    type ResponseStream = QuotaStream;
    type Future = BoxFuture<Response<QuotaStream>, Status>;

    fn call(&mut self, request: Request<Streaming<RateLimitQuotaUsageReports>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.stream_rate_limit_quotas(request).await })
    }
}

/// A gRPC service of one method: its path, and how tonic's protobuf codec answers it.
pub trait OneMethod: Clone + Send + 'static {
    const PATH: &'static str;

    fn answer<B>(self, request: http::Request<B>) -> impl Future<Output = http::Response<GrpcBody>> + Send
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static;
}

impl OneMethod for RateLimitServer {
    const PATH: &'static str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

    async fn answer<B>(self, request: http::Request<B>) -> http::Response<GrpcBody>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        Grpc::new(ProstCodec::default()).unary(self, request).await
    }
}

impl OneMethod for RateLimitQuotaServer {
    const PATH: &'static str =
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

    async fn answer<B>(self, request: http::Request<B>) -> http::Response<GrpcBody>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        Grpc::new(ProstCodec::default()).streaming(self, request).await
    }
}

/// Routes a request to `S`'s one method, or answers `UNIMPLEMENTED`.
#[derive(Clone)]
pub struct Routed<S>(pub S);

impl<S: OneMethod + NamedService> NamedService for Routed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Routed<S>
where
    S: OneMethod,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<GrpcBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != S::PATH {
                return Ok(unimplemented());
            }
            Ok(method.answer(request).await)
        })
    }
}

/// A method the service does not have: gRPC status `UNIMPLEMENTED`, no body.
fn unimplemented() -> http::Response<GrpcBody> {
    Status::unimplemented("no such method").into_http()
}
