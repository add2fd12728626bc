//! What a lab run runs: the suites, their tests and tiers, the guests they need, and the
//! selection the command line makes (libtest's arguments, so `cargo test` and its filters work).

use std::time::Duration;

/// A lab test: builds its own topology (dropping it tears it down) and returns an error or panics
/// to fail. It must leave nothing behind: the next test (of any suite) runs in the same guest.
pub type TestFn = fn() -> anyhow::Result<()>;

/// One test of a suite.
#[derive(Clone, Copy)]
pub struct Test {
    pub name: &'static str,
    pub run: TestFn,
}

/// `a`'s tests, then `b`'s: for a suite whose long tier is another suite's two tiers
/// (`const BOTH: [Test; A.len() + B.len()] = plan::both(A, B);`).
pub const fn both<const N: usize>(a: &[Test], b: &[Test]) -> [Test; N] {
    assert!(
        a.len() + b.len() == N && !a.is_empty(),
        "both: N must be the two lengths"
    );
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < a.len() { a[i] } else { b[i - a.len()] };
        i += 1;
    }
    out
}

/// `crate::tests![a, b]`: the tests `a` and `b` (functions of the calling module) by their names.
#[macro_export]
macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        &[$($crate::plan::Test { name: stringify!($name), run: $name }),*]
    };
}

/// Which kernel a suite's guest boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestKernel {
    /// The kernel package of the host's own Debian release (Debian 12: Linux 6.1).
    Host,
    /// The newest kernel of another Debian suite (e.g. `unstable`), for a suite that needs a
    /// newer kernel than the host's release carries (nvmet's reservations came with 6.13).
    Suite(&'static str),
}

/// What runs as the guest's PID 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestInit {
    /// The lab's own init (tests/lab/init): a shell in the host's root, no service manager. The
    /// suites start what they need themselves, each test from a clean guest.
    Lab,
    /// systemd, booting the host's root as a node boots (tests/lab/init, `lab.init=systemd`):
    /// journald, udevd, dbus and iscsid as units, and the package's unit under systemd with its
    /// whole sandbox.
    Systemd,
}

/// The userspace a suite's guest runs: the node's Debian release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestRoot {
    /// The host's own root (Debian 12 on CI: Pacemaker 2.1, multipath-tools 0.9).
    Host,
    /// A root of another Debian suite (`trixie`, Debian 13: Pacemaker 3.0, pcs 0.12,
    /// multipath-tools 0.11), built from Debian's packages by tests/lab/root.sh and cached; the
    /// checkout and the build's target directory are seen in it at their host paths.
    Suite(&'static str),
}

/// A lab suite: tests that prove one part of prfence on a target, run one after the other in a
/// guest shared with every other suite that boots the same kernel.
pub struct Suite {
    /// Its name, the first part of its tests' names (`fence::mutual_fence_race_has_one_survivor`).
    pub name: &'static str,
    pub kernel: GuestKernel,
    /// The guest installs the .deb built around the binary under test before this suite runs:
    /// the suite tests prfence as an admin installs it (`/usr/sbin/prfence`, the `fence_pr` link
    /// where pacemaker-fenced looks for agents, the man pages).
    pub package: bool,
    /// What the suite's guest runs as PID 1.
    pub init: GuestInit,
    /// The node's userspace.
    pub root: GuestRoot,
    /// The vCPUs of its guest (the most of the suites sharing one). One where a suite's tests
    /// run one after the other: under TCG a second vCPU costs more than it gives (the agent
    /// suite 220 s with one, 235 s with two, alone on the 2-CPU machine; booting 16 s, 21 s).
    /// Two where a cluster stack runs (corosync's token, Pacemaker's daemons beside the nodes).
    pub cpus: usize,
    /// How long the suite may run in its guest (about three times its usual time under
    /// emulation); past it the guest is stopped and the suite fails. `LAB_TIMEOUT` (seconds)
    /// overrides it.
    pub budget: Duration,
    /// How long its tests usually take in a guest on the 2-CPU machine (CI's tier measured in
    /// the fresh-clone CI of 9bc400a; for a suite of the long tier alone, a third of its
    /// budget): orders the guests longest first and cuts a setup's suites into guests of their
    /// own when several run at once. Never a limit.
    pub usual: Duration,
    /// The tests `cargo test` runs (CI's tier).
    pub tests: &'static [Test],
    /// The long tier: run only when asked for (`-- --ignored`, libtest's ignored tests), never
    /// in CI. Each says in its documentation what it runs longer and which CI test keeps a case.
    pub long: &'static [Test],
    /// Reproducers of a target's known bug (docs/target-notes.md): expected to fail on an
    /// affected kernel, so never part of a tier; ignored tests that run only when a filter names
    /// them (`-- --ignored stress::raw_preempts`).
    pub reproducers: &'static [Test],
}

/// A test picked to run, with its suite.
#[derive(Clone, Copy)]
pub struct Picked {
    pub suite: &'static Suite,
    pub test: Test,
}

impl Picked {
    /// `suite::test`, the name filters match and results are reported under.
    pub fn name(&self) -> String {
        format!("{}::{}", self.suite.name, self.test.name)
    }
}

/// The command line, as libtest takes it (`cargo test --test lab -- ARGS`).
#[derive(Debug, Default)]
pub struct Args {
    pub filters: Vec<String>,
    pub skip: Vec<String>,
    pub exact: bool,
    pub list: bool,
    /// `--ignored`: the long tier only.
    pub ignored: bool,
    /// `--include-ignored`: both tiers.
    pub include_ignored: bool,
}

impl Args {
    /// Parses libtest's arguments. Options the lab has no use for (`--nocapture`,
    /// `--test-threads N`, `--color WHEN`, `-q`…) are accepted and ignored, their values too.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Args {
        let mut parsed = Args::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--exact" => parsed.exact = true,
                "--list" => parsed.list = true,
                "--ignored" => parsed.ignored = true,
                "--include-ignored" => parsed.include_ignored = true,
                "--skip" => parsed.skip.extend(args.next()),
                "--test-threads" | "--color" | "--format" | "--logfile" | "-Z" => {
                    let _ = args.next();
                }
                _ if arg.starts_with('-') => {}
                _ => parsed.filters.push(arg),
            }
        }
        parsed
    }

    fn matches(&self, name: &str) -> bool {
        let hit = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(hit)) && !self.skip.iter().any(hit)
    }

    /// The tests these arguments select, in `suites` order: CI's tier unless `--ignored` (the
    /// long tier only) or `--include-ignored` (both); and how many of those tiers' tests the
    /// filters left out.
    pub fn select(&self, suites: &'static [Suite]) -> (Vec<Picked>, usize) {
        let mut picked = Vec::new();
        let mut filtered = 0;
        for suite in suites {
            let ci = suite.tests.iter().filter(|_| !self.ignored);
            let long = suite
                .long
                .iter()
                .filter(|_| self.ignored || self.include_ignored);
            let reproducers = suite
                .reproducers
                .iter()
                .filter(|_| (self.ignored || self.include_ignored) && !self.filters.is_empty());
            for &test in ci.chain(long).chain(reproducers) {
                let pick = Picked { suite, test };
                if self.matches(&pick.name()) {
                    picked.push(pick);
                } else {
                    filtered += 1;
                }
            }
        }
        (picked, filtered)
    }

    /// `--list` in libtest's format (`name: test`), which cargo-nextest reads too: every test,
    /// or with `--ignored` the ignored ones (the long tier and the reproducers).
    pub fn print_list(&self, suites: &'static [Suite]) {
        for suite in suites {
            let ci = suite.tests.iter().filter(|_| !self.ignored);
            for test in ci.chain(suite.long).chain(suite.reproducers) {
                let pick = Picked { suite, test: *test };
                if self.matches(&pick.name()) {
                    println!("{}: test", pick.name());
                }
            }
        }
    }
}

/// The test named `name` (`suite::test`, either tier).
pub fn find(suites: &'static [Suite], name: &str) -> Option<Picked> {
    let (suite_name, test_name) = name.split_once("::")?;
    let suite = suites.iter().find(|s| s.name == suite_name)?;
    let test = suite
        .tests
        .iter()
        .chain(suite.long)
        .chain(suite.reproducers)
        .find(|t| t.name == test_name)?;
    Some(Picked { suite, test: *test })
}
