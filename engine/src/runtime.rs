//! The engine's clock, sleeps and threads, and the one fan-out over them: the system's monotonic
//! clock and OS threads, or, in tests, a deterministic simulation's.
//!
//! Every wait in the engine goes through here (the tie-break, NOT READY backoff, the deadline of
//! a fan-out), and so does every thread it starts. Release builds have only the system's; with
//! the `test-support` feature a simulation can install its scheduler on a thread
//! ([`simulated::install`]), and from then on that thread, and every thread it starts through
//! [`fan_out`], reads the simulation's clock and yields to its scheduler instead of blocking. So
//! the simulation runs the engine's own code, unchanged, under schedules it chooses (P1–P5 are
//! checked there after every step).
//!
//! The engine's operations block their calling thread; a front end in async code runs them on a
//! blocking thread. Each LU gets a thread of its own for one operation: a command blocked in the
//! kernel (SCSI error recovery, a hung path) then holds only that thread, which is left behind
//! at the deadline rather than joined.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The engine's monotonic clock.
pub fn now() -> Instant {
    #[cfg(feature = "test-support")]
    if let Some(scheduler) = simulated::current() {
        return scheduler.now();
    }
    Instant::now()
}

/// Blocks the calling thread for `duration` on the engine's clock.
pub fn sleep(duration: Duration) {
    #[cfg(feature = "test-support")]
    if let Some(scheduler) = simulated::current() {
        let until = scheduler.now() + duration;
        while scheduler.now() < until {
            scheduler.park(Some(until));
        }
        return;
    }
    std::thread::sleep(duration);
}

/// Starts `job` on a thread of its own, never joined.
fn spawn(name: &str, job: Box<dyn FnOnce() + Send>) -> Result<(), String> {
    #[cfg(feature = "test-support")]
    if let Some(scheduler) = simulated::current() {
        return scheduler.spawn(job);
    }
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(job)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What became of one item of a [`fan_out`].
#[derive(Debug)]
pub enum Finished<R> {
    /// The work returned `value` after running for `took`.
    Done { value: R, took: Duration },
    /// Still running at the deadline; its thread is left to finish in the background.
    TimedOut,
    /// The work panicked; nothing is known about what it did.
    Panicked,
    /// No thread could be started for it (thread or memory limits).
    NotStarted(String),
}

/// Runs `work` on every item at once, each on a thread of its own, until `until` on the engine's
/// clock. `tell` hears of each item as it finishes, in the order they finish (so one slow item
/// does not hold back the news of the others), on the calling thread. Results come back in item
/// order. Items still running at `until` are not waited for: a rerun of an idempotent operation
/// converges (P4).
pub fn fan_out<T, R, W>(
    items: &[T],
    until: Instant,
    work: W,
    tell: &mut dyn FnMut(usize, &R, Duration),
) -> Vec<Finished<R>>
where
    T: Clone + Send + 'static,
    R: Send + 'static,
    W: Fn(&T) -> R + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let (send, receive) = channel::<(usize, Option<(R, Duration)>)>();
    let mut results: Vec<Option<Finished<R>>> = Vec::with_capacity(items.len());
    let mut pending = 0;
    for (index, item) in items.iter().enumerate() {
        let (work, send, item) = (Arc::clone(&work), send.clone(), item.clone());
        let job = Box::new(move || {
            let began = now();
            // A panic is reported as such rather than taken for a timeout.
            let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&item)))
                .ok()
                .map(|value| (value, now().saturating_duration_since(began)));
            send.send((index, value));
        });
        match spawn("prfence-lu", job) {
            Ok(()) => {
                results.push(None);
                pending += 1;
            }
            Err(why) => results.push(Some(Finished::NotStarted(why))),
        }
    }
    drop(send);
    while pending > 0 {
        let Some((index, value)) = receive.recv_until(until) else {
            break;
        };
        pending -= 1;
        let finished = match value {
            Some((value, took)) => {
                tell(index, &value, took);
                Finished::Done { value, took }
            }
            None => Finished::Panicked,
        };
        if let Some(slot) = results.get_mut(index) {
            *slot = Some(finished);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Finished::TimedOut))
        .collect()
}

/// Runs `job` on a thread of its own until `until` on the engine's clock: its value, or
/// [`Finished::TimedOut`] (the thread is left to finish in the background).
pub fn run_until<R, J>(until: Instant, job: J) -> Finished<R>
where
    R: Send + 'static,
    J: FnOnce() -> R + Send + 'static,
{
    let job = Arc::new(Mutex::new(Some(job)));
    let take = move |_: &()| {
        let job = job.lock().unwrap_or_else(PoisonError::into_inner).take();
        job.map(|job| job())
    };
    match fan_out(&[()], until, take, &mut |_, _, _| {})
        .pop()
        .unwrap_or(Finished::Panicked)
    {
        Finished::Done {
            value: Some(value),
            took,
        } => Finished::Done { value, took },
        Finished::Done { value: None, .. } | Finished::Panicked => Finished::Panicked,
        Finished::TimedOut => Finished::TimedOut,
        Finished::NotStarted(why) => Finished::NotStarted(why),
    }
}

/// A many-to-one channel whose receiver waits on the engine's clock (in a simulation, by
/// yielding to its scheduler).
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            senders: 1,
            #[cfg(feature = "test-support")]
            waiter: None,
        }),
        ready: Condvar::new(),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    /// The simulated thread parked in `recv_until`, to be woken by a send.
    #[cfg(feature = "test-support")]
    waiter: Option<simulated::ThreadId>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The state is a queue and a count: a panic elsewhere cannot leave it half changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, state: &mut State<T>) {
        #[cfg(feature = "test-support")]
        if let (Some(waiter), Some(scheduler)) = (state.waiter.take(), simulated::current()) {
            scheduler.unpark(waiter);
        }
        let _ = state;
        self.ready.notify_all();
    }
}

/// The sending half of [`channel`].
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    pub fn send(&self, item: T) {
        let mut state = self.shared.lock();
        state.items.push_back(item);
        self.shared.changed(&mut state);
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders -= 1;
        self.shared.changed(&mut state);
    }
}

/// The receiving half of [`channel`].
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// The next item; `None` once `until` has passed, or when every sender is gone.
    pub fn recv_until(&self, until: Instant) -> Option<T> {
        let mut state = self.shared.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                return Some(item);
            }
            if state.senders == 0 {
                return None;
            }
            let left = until.saturating_duration_since(now());
            if left.is_zero() {
                return None;
            }
            #[cfg(feature = "test-support")]
            if let Some(scheduler) = simulated::current() {
                state.waiter = Some(scheduler.thread());
                drop(state);
                scheduler.park(Some(until));
                state = self.shared.lock();
                continue;
            }
            state = self
                .shared
                .ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The seam a deterministic simulation plugs into (tests only).
#[cfg(feature = "test-support")]
pub mod simulated {
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::time::Instant;

    /// A simulated thread, as its scheduler names it.
    pub type ThreadId = u64;

    /// A scheduler that runs one simulated thread at a time. Every method is called from the
    /// simulated thread that holds the turn.
    pub trait Scheduler: Send + Sync {
        /// The calling thread's clock (each simulated node may have its own rate).
        fn now(&self) -> Instant;
        /// The calling simulated thread.
        fn thread(&self) -> ThreadId;
        /// Gives up the turn until [`Scheduler::unpark`] names this thread or the clock reaches
        /// `until`; may return early (callers re-check what they wait for).
        fn park(&self, until: Option<Instant>);
        /// Makes a parked thread runnable again.
        fn unpark(&self, thread: ThreadId);
        /// Starts `job` as a new simulated thread of the caller's node, with this scheduler
        /// installed; it runs when the scheduler gives it a turn.
        fn spawn(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), String>;
    }

    thread_local! {
        static SCHEDULER: RefCell<Option<Arc<dyn Scheduler>>> = const { RefCell::new(None) };
    }

    /// Makes the calling thread a simulated one: the engine's clock, sleeps and threads are
    /// `scheduler`'s from now on.
    pub fn install(scheduler: Arc<dyn Scheduler>) {
        SCHEDULER.with(|s| *s.borrow_mut() = Some(scheduler));
    }

    /// The calling thread goes back to the system's clock and threads.
    pub fn uninstall() {
        SCHEDULER.with(|s| *s.borrow_mut() = None);
    }

    pub(super) fn current() -> Option<Arc<dyn Scheduler>> {
        SCHEDULER.with(|s| s.borrow().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_item_order_and_are_told_as_they_finish() {
        let until = now() + Duration::from_secs(10);
        let mut told = Vec::new();
        let results = fan_out(
            &[30u64, 0, 10],
            until,
            |&ms| {
                std::thread::sleep(Duration::from_millis(ms));
                ms * 2
            },
            &mut |index, value, _| told.push((index, *value)),
        );
        let values: Vec<Option<u64>> = results
            .into_iter()
            .map(|r| match r {
                Finished::Done { value, .. } => Some(value),
                _ => None,
            })
            .collect();
        assert_eq!(values, vec![Some(60), Some(0), Some(20)]);
        assert_eq!(told.len(), 3);
        assert_eq!(told.last(), Some(&(0, 60)), "the slowest is told last");
    }

    #[test]
    fn an_item_still_running_at_the_deadline_is_timed_out() {
        let until = now() + Duration::from_millis(200);
        let results = fan_out(
            &[0u64, 5000],
            until,
            |&ms| std::thread::sleep(Duration::from_millis(ms)),
            &mut |_, _, _| {},
        );
        assert!(matches!(results[0], Finished::Done { .. }), "{results:?}");
        assert!(matches!(results[1], Finished::TimedOut), "{results:?}");
    }

    #[test]
    fn a_panic_is_reported_as_a_panic() {
        let until = now() + Duration::from_secs(60);
        let results = fan_out(
            &[false, true],
            until,
            |&panics| assert!(!panics, "the work panicked"),
            &mut |_, _, _| {},
        );
        assert!(matches!(results[0], Finished::Done { .. }), "{results:?}");
        assert!(matches!(results[1], Finished::Panicked), "{results:?}");
    }
}
