//! The agent's edge to the operating system, thin and without policy: the hardware watchdog
//! device, sd_notify, logging to journald or stderr, and the thread the self-fence hook runs on.

pub(super) mod hook_thread;
pub mod logging;
pub mod notify;
pub mod watchdog;
