//! [`StoreAdmin`] on [`RedisStore`]: what readiness and the admin endpoints need, apart
//! from the checks: PING, deleting a counter, finding a counter's other variants.

use super::RedisStore;
use crate::store::redis_connection::Connection;
use crate::store::{StoreAdmin, StoreError};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::FromRedisValue;

impl StoreAdmin for RedisStore {
    /// PING (every master of a cluster).
    async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        let (connection, generation) = self.connection();
        match connection {
            Connection::Standalone(mut manager) => {
                self.bounded(
                    generation,
                    self.config.timeout,
                    ping.query_async::<String>(&mut manager),
                )
                .await?;
            }
            Connection::Cluster(mut cluster) => {
                self.bounded(
                    generation,
                    self.config.timeout,
                    ping.query_async::<redis::Value>(&mut cluster),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Deletes `key`; whether it was there. One key per command, so on a cluster it goes
    /// to the node holding its slot.
    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut del = redis::cmd("DEL");
        del.arg(key);
        let (connection, generation) = self.connection();
        let deleted: i64 = match connection {
            Connection::Standalone(mut manager) => {
                self.bounded(generation, self.config.timeout, del.query_async(&mut manager))
                    .await?
            }
            Connection::Cluster(mut cluster) => {
                self.bounded(generation, self.config.timeout, del.query_async(&mut cluster))
                    .await?
            }
        };
        Ok(deleted > 0)
    }

    /// By SCAN on the node holding `near`'s slot; each SCAN call is bounded by the
    /// timeout, and Redis serves others between them.
    async fn scan_near(&self, near: &str, pattern: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
            let (connection, generation) = self.connection();
            let (next, keys): (u64, Vec<String>) = match connection {
                Connection::Standalone(mut manager) => {
                    self.bounded(generation, self.config.timeout, scan.query_async(&mut manager))
                        .await?
                }
                Connection::Cluster(mut cluster) => {
                    let route = Route::with_slot(Slot::for_key(near), SlotAddr::Master);
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    let reply = self
                        .bounded(
                            generation,
                            self.config.timeout,
                            cluster.route_command(scan, routing),
                        )
                        .await?;
                    FromRedisValue::from_redis_value(reply).map_err(|e| StoreError::Redis(e.into()))?
                }
            };
            found.extend(keys);
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                found.truncate(limit);
                return Ok(found);
            }
        }
    }
}
