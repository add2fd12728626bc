//! The agent's current state as one JSON document: served at `GET /status`, written to
//! `--status-file` when it changes (by the driver's [`super::status_file`]), and printed by
//! `--once`. Meant for tests and humans; metrics are for monitoring.

use serde::Serialize;

use super::config::DeviceSettings;
use crate::discover::LuId;
use crate::ops::{LuSet, OtherKeyOnOwnInitiator};

/// What the agent is doing, node-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Starting,
    /// Watch mode: our key is not yet on every LU (fence_pr's unfencing registers it); nothing
    /// is judged and the watchdog is not opened until it is. An LU that cannot be read before
    /// arming shows `Degraded` instead (the LU's verdict names the error).
    WaitingForRegistration,
    /// Watch mode: our key is on every LU and every path.
    Healthy,
    /// Watch mode: not fenced, but an LU is unreadable, missed our key once, a path lacks
    /// its registration, or the configured watchdog cannot be opened or fed.
    Degraded,
    /// Lease mode: not holding every LU.
    Standby,
    /// Lease mode: holding every LU (the service may run).
    Holder,
    Fenced,
    Stopping,
}

/// A lease-mode node's part, as the metrics show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Standby,
    /// Holds the reservation; `promoted` once the lease is confirmed in this run.
    Holder {
        promoted: bool,
    },
    Fenced,
}

impl State {
    /// Every state, in declaration order (a metric lists them all).
    pub const ALL: [State; 8] = [
        State::Starting,
        State::WaitingForRegistration,
        State::Healthy,
        State::Degraded,
        State::Standby,
        State::Holder,
        State::Fenced,
        State::Stopping,
    ];
}

/// The hardware watchdog, as far as the agent knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchdogState {
    /// No `[watchdog]` in the configuration.
    NotConfigured,
    /// Configured, not opened yet (watch mode opens it once armed).
    NotArmed,
    /// Open, and the last feed (if any) worked.
    Ok,
    /// Configured and due, but it cannot be opened or fed: no hardware reset backs the agent.
    /// Watch mode retries the open at every check.
    Degraded,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchdogStatus {
    pub state: WatchdogState,
    /// Why it is degraded.
    pub error: Option<String>,
}

/// Self-fence step 1: stopping the watchdog's feeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchdogStep {
    /// Feeding stopped; the hardware resets the node after its timeout.
    Ok,
    /// Configured, but not open: nothing is there to reset the node.
    Failed,
    NotConfigured,
    /// `self_fence.stop_watchdog` is off: still fed (until a reboot fails).
    KeptFeeding,
}

/// Self-fence step 2: the stop hook (`self_fence.command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HookStep {
    /// Started, not done yet.
    Running,
    Ok,
    Failed,
    TimedOut,
    NotConfigured,
}

/// Self-fence step 3: reboot(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RebootStep {
    /// Asked for (shown before the call; a reboot that works ends the process).
    Requested,
    Failed,
    Disabled,
}

/// What each self-fence step did; `None` in [`Status::self_fence`] until fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SelfFenceSteps {
    pub watchdog: WatchdogStep,
    pub hook: HookStep,
    pub reboot: RebootStep,
    /// Every step ran (the agent exits next, or stays fenced with `self_fence.exit` off). An
    /// agent started in the same boot over a status file that says fenced but not finished (it
    /// was killed or crashed mid-way) runs the self-fence again at once.
    pub finished: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathStatus {
    pub name: String,
    pub dev: String,
    pub live: bool,
    pub session: Option<String>,
    /// A command or open on this path has not returned from the kernel yet: it holds one
    /// thread, and the path gets no other command until it returns.
    pub blocked: bool,
}

/// Another node's key found on part of this node's LUs ([`Status::keys_not_on_every_lu`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyNotOnEveryLu {
    pub key: String,
    /// The LUs (configured names) where it is not registered.
    pub missing_on: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LuStatus {
    /// The configured name.
    pub name: String,
    /// The LU identifier, once discovered.
    pub id: Option<LuId>,
    /// Watch mode: one of the coordinators (`coordinator = true`), judged by their majority.
    pub coordinator: bool,
    /// The last verdict (watch) or role (lease), in words.
    pub verdict: String,
    /// The keys listed by the last good READ KEYS.
    pub keys: Vec<String>,
    pub paths: Vec<PathStatus>,
    /// Lease mode: this node's key on the LU.
    pub lease_key: Option<String>,
    /// Watch mode: registrations of this node's own initiator (iSCSI initiator name, NVMe host
    /// id) that carry another key: a node sharing that initiator (cloned), or this node's old
    /// key. Read where our key is registered fewer times than expected; degraded while any is.
    pub other_keys_on_own_initiator: Vec<OtherKeyOnOwnInitiator>,
}

/// The status document's version (`version`, its JSON Schema's `$id`,
/// packaging/status.schema.json): bumped when a field changes meaning or goes away; a new field
/// does not bump it.
pub const STATUS_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// [`STATUS_VERSION`].
    pub version: u32,
    pub mode: &'static str,
    pub state: State,
    pub fenced_reason: Option<String>,
    /// Watch mode: the key we watch for.
    pub own_key: Option<String>,
    /// Watch mode with `key.derive`: why our key is not known yet (corosync does not answer) or
    /// is in doubt (the host name, corosync and the key store disagree about who this node is).
    pub key_problem: Option<String>,
    /// Checks (ticks) done since start.
    pub checks: u64,
    pub lus: Vec<LuStatus>,
    /// The LUs as this node identified them, to compare with the other nodes' (P2: the same
    /// LUs everywhere, or nodes can pick different arbiters).
    pub lu_set: LuSet,
    /// Watch mode: other nodes' keys that have stayed registered on some of this node's LUs and
    /// not on the others for `watch.grace`: such a node names another LU set than this one (or
    /// its registration was left half done). Empty when every key is on every LU read.
    pub keys_not_on_every_lu: Vec<KeyNotOnEveryLu>,
    pub watchdog: WatchdogStatus,
    /// Each self-fence step's result, once fenced.
    pub self_fence: Option<SelfFenceSteps>,
    /// The kernel's boot id (/proc/sys/kernel/random/boot_id) of the boot the agent runs in: a
    /// status file from an earlier boot says nothing about this one.
    pub boot_id: Option<String>,
    /// When this document was written, in seconds since the Unix epoch (the node's wall clock,
    /// for a reader to tell a stale file; nothing is decided on it).
    pub updated_unix: Option<u64>,
}

impl Status {
    /// The status before the first check, of the configured `devices` in their order.
    pub fn new(mode: &'static str, devices: &[DeviceSettings]) -> Status {
        Status {
            version: STATUS_VERSION,
            mode,
            state: State::Starting,
            fenced_reason: None,
            own_key: None,
            key_problem: None,
            checks: 0,
            lus: devices
                .iter()
                .map(|device| LuStatus {
                    name: device.name.clone(),
                    coordinator: device.coordinator,
                    id: None,
                    verdict: "not checked yet".to_owned(),
                    keys: Vec::new(),
                    paths: Vec::new(),
                    lease_key: None,
                    other_keys_on_own_initiator: Vec::new(),
                })
                .collect(),
            lu_set: LuSet::of(devices.iter().map(|_| None::<LuId>)),
            keys_not_on_every_lu: Vec::new(),
            watchdog: WatchdogStatus {
                state: WatchdogState::NotConfigured,
                error: None,
            },
            self_fence: None,
            boot_id: None,
            updated_unix: None,
        }
    }

    /// Whether `other` says what `self` says but for the counters that move with every check
    /// (`checks`, `updated_unix`): the status file is then not rewritten (its modification time
    /// is). Every other field is compared, a field added later too (the pattern names them all).
    pub fn same_but_counters(&self, other: &Status) -> bool {
        let Status {
            version,
            mode,
            state,
            fenced_reason,
            own_key,
            key_problem,
            checks: _,
            lus,
            lu_set,
            keys_not_on_every_lu,
            watchdog,
            self_fence,
            boot_id,
            updated_unix: _,
        } = self;
        *version == other.version
            && *mode == other.mode
            && *state == other.state
            && *fenced_reason == other.fenced_reason
            && *own_key == other.own_key
            && *key_problem == other.key_problem
            && *lus == other.lus
            && *lu_set == other.lu_set
            && *keys_not_on_every_lu == other.keys_not_on_every_lu
            && *watchdog == other.watchdog
            && *self_fence == other.self_fence
            && *boot_id == other.boot_id
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| error_json(&e.to_string()))
    }
}

/// The document shown in place of the status when it cannot be serialized: `{"error": …}`,
/// built by serde_json so that quotes, backslashes and newlines in the error stay valid JSON.
pub fn error_json(error: &str) -> String {
    serde_json::json!({ "error": error }).to_string()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// One data LU named "data", as tests show it.
    pub fn one_lu() -> Vec<DeviceSettings> {
        vec![DeviceSettings {
            path: "/dev/data".into(),
            name: "data".to_owned(),
            coordinator: false,
        }]
    }

    #[test]
    fn an_error_document_is_json_whatever_the_error_says() {
        let error = "key \"0xabc\" is not\nvalid at C:\\path\t\u{1}";
        let document: serde_json::Value = serde_json::from_str(&error_json(error)).unwrap();
        assert_eq!(document, serde_json::json!({ "error": error }));
    }
}
