//! The self-fence hook on a thread of its own, started with the agent.
//!
//! In a storage outage every hung path holds a thread of tokio's blocking pool for as long as
//! its SG_IO call is stuck in the kernel. The hook is what ends the outage for this node (it
//! stops the services, and a reboot follows), so it must never wait for a pool thread: it runs
//! on this thread, which touches no LU and is idle until the one self-fence.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::host::Host;
use crate::process::RunError;

/// Why the hook did not run to a success.
#[derive(Debug, thiserror::Error)]
pub(in crate::daemon) enum HookError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("the self-fence thread is gone (it panicked); the hook did not run")]
    ThreadGone,
}

struct Job {
    argv: Vec<String>,
    timeout: Duration,
    done: oneshot::Sender<Result<Vec<u8>, RunError>>,
}

/// The handle of the hook's thread; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub(in crate::daemon) struct HookThread {
    jobs: mpsc::Sender<Job>,
}

impl HookThread {
    /// Starts the thread. Failing here (no thread can be made) fails the agent's start: an agent
    /// that could not run its hook when fenced must not claim to protect the node.
    pub(in crate::daemon) fn start(host: Arc<dyn Host>) -> std::io::Result<HookThread> {
        let (jobs, incoming) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("self-fence".to_owned())
            .spawn(move || {
                for job in incoming {
                    let (program, args) = job
                        .argv
                        .split_first()
                        .map_or((Path::new(""), &[][..]), |(p, a)| {
                            (Path::new(p.as_str()), a)
                        });
                    let result = host.run_bounded(program, args, Some(job.timeout));
                    // The agent may have stopped waiting (it is exiting): nobody to tell.
                    let _ = job.done.send(result);
                }
            })?;
        Ok(HookThread { jobs })
    }

    /// Runs `argv` (program first) on the hook's thread, killed with everything it started after
    /// `timeout`.
    pub(in crate::daemon) async fn run(
        &self,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<(), HookError> {
        let (done, result) = oneshot::channel();
        self.jobs
            .send(Job {
                argv,
                timeout,
                done,
            })
            .map_err(|_| HookError::ThreadGone)?;
        match result.await {
            Ok(ran) => ran.map(drop).map_err(HookError::from),
            Err(_) => Err(HookError::ThreadGone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SystemHost;

    /// The hook runs while every thread of the runtime's blocking pool is held by a call that
    /// does not return (as SG_IO on a hung path does): it does not queue behind them.
    #[test]
    fn the_hook_runs_while_the_blocking_pool_is_exhausted() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = Arc::new(std::sync::Mutex::new(hung));
        let hook = HookThread::start(Arc::new(SystemHost::new())).unwrap();
        let ran = runtime.block_on(async {
            for _ in 0..4 {
                let hung = Arc::clone(&hung);
                // Two hold the pool's threads, two more queue behind them.
                drop(tokio::task::spawn_blocking(move || {
                    let _ = hung.lock().map(|rx| rx.recv());
                }));
            }
            tokio::time::timeout(
                Duration::from_secs(10),
                hook.run(
                    vec!["/bin/sh".into(), "-c".into(), "exit 0".into()],
                    Duration::from_secs(5),
                ),
            )
            .await
        });
        drop(release);
        runtime.shutdown_timeout(Duration::from_millis(100));
        assert!(
            matches!(ran, Ok(Ok(()))),
            "the hook waited for the blocking pool: {ran:?}"
        );
    }

    #[test]
    fn a_failing_hook_says_how() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let hook = HookThread::start(Arc::new(SystemHost::new())).unwrap();
        let failed = runtime.block_on(hook.run(
            vec!["/bin/sh".into(), "-c".into(), "sleep 5".into()],
            Duration::from_millis(100),
        ));
        assert!(
            matches!(failed, Err(HookError::Run(RunError::TimedOut(_)))),
            "{failed:?}"
        );
    }
}
