//! Child processes killed on drop (or, for servers shared by a test binary's tests, when
//! the test process ends), scratch directories, and polling for readiness.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The repository's root (the shim's package is one folder below it).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the shim's package lies in the repository")
        .to_path_buf()
}

/// A fresh directory (under `target/test-runs`) for one process's or test's files.
pub fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = repo_root().join("target/test-runs").join(format!(
        "{}-{}-{}",
        name,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `ready` until it holds or `timeout` passes. Timeouts given to it are limits on
/// a hang, not expectations of speed: size them for a loaded two-core machine.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} not ready after {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed on drop; its output goes to `log`.
pub struct Process {
    child: Child,
    pub log: PathBuf,
    /// For a process that outlives every test of its binary (a static is never dropped):
    /// a watchdog that kills it once the pipe to it closes, which the kernel does when
    /// the test process ends, however it ends.
    watchdog: Option<(Child, ChildStdin)>,
}

impl Process {
    pub fn spawn(command: &mut Command, log: PathBuf) -> Process {
        let out = fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        Process {
            child,
            log,
            watchdog: None,
        }
    }

    /// Kills this process when the test process ends, even if it is never dropped.
    pub fn tie_to_test_process(&mut self) {
        let mut watchdog = Command::new("sh")
            .args(["-c", &format!("cat >/dev/null; kill {}", self.pid())])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the watchdog: {e}"));
        let pipe = watchdog.stdin.take().unwrap();
        self.watchdog = Some((watchdog, pipe));
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        // The watchdog first, so that it never signals a process id reused since.
        if let Some((mut watchdog, pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            drop(pipe);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Sends a signal (`TERM`, `STOP`, `CONT`, ...) with the `kill` command.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits for the process to exit on its own, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory in KiB, from `/proc`.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
