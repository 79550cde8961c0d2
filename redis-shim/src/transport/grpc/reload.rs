//! `--rls-config` kept current: [`LiveConfig`] holds the configuration the services
//! decide by, loaded whole by [`loading::load`] (every file, every file's error), and
//! [`watch`] polls the files once a second and swaps in a changed
//! configuration that loads, as the Wasm filter's configuration reloads. A change that
//! does not load keeps the last good configuration, logged with all its errors and counted
//! in `rlshim_rls_config_reloads_total{outcome="refused"}`.
//!
//! Files are compared by their contents (not their times), read through symbolic links:
//! a file rewritten in place and a directory swapped through a link (a Kubernetes
//! ConfigMap's `..data`) are both seen.

use crate::decide::rls::config;
use crate::decide::rls::loading::{self, describe, load, Snapshot};
use crate::transport::config::RlsOptions;
use crate::transport::shim::Shim;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch as stop_watch;

/// How often the files are read for a change.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The configuration requests are decided by, replaced whole by a reload: a request
/// takes the one current when it starts and keeps it to its end.
pub struct LiveConfig(RwLock<Arc<config::RlsConfig>>);

impl LiveConfig {
    pub fn new(config: config::RlsConfig) -> LiveConfig {
        LiveConfig(RwLock::new(Arc::new(config)))
    }

    pub fn current(&self) -> Arc<config::RlsConfig> {
        match self.0.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, config: config::RlsConfig) {
        let config = Arc::new(config);
        match self.0.write() {
            Ok(mut current) => *current = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }
}

/// Polls the configuration's files every [`POLL_INTERVAL`] until `stop` turns true,
/// loading it whenever they differ from what they were (`seen`, read before `live`'s
/// configuration was loaded) and swapping it into `live` when it loads.
pub fn watch(
    options: RlsOptions,
    mut seen: Snapshot,
    live: Arc<LiveConfig>,
    shim: Arc<Shim>,
    mut stop: stop_watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(POLL_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let polled = options.clone();
            let Ok(now) = tokio::task::spawn_blocking(move || loading::snapshot(&polled.files())).await
            else {
                return;
            };
            if now == seen {
                continue;
            }
            seen = now;
            let polled = options.clone();
            let Ok(loaded) = tokio::task::spawn_blocking(move || load(&polled.files())).await else {
                return;
            };
            match loaded {
                Ok(config) => {
                    tracing::info!(
                        config = %options.config_path.display(),
                        domains = config.domains.len(),
                        "--rls-config changed: reloaded"
                    );
                    live.replace(config);
                    shim.metrics.rls.reload(true);
                }
                Err(errors) => {
                    tracing::error!(
                        "{}\n(--rls-config changed but is refused: the last good configuration stays)",
                        describe(&errors)
                    );
                    shim.metrics.rls.reload(false);
                }
            }
        }
    });
}
