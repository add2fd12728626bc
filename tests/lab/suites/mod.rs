//! The lab suites, one module each. A suite is a [`Suite`] constant named `SUITE`; [`ALL`] is
//! the order they run in: the suites on the host release's kernel share one guest (those that
//! test the installed package last, so that the others run without it), then the suites on a
//! newer Debian suite's kernel share another.

use crate::plan::Suite;

pub mod agent;
mod arrays;
mod bench;
mod bench_agent;
mod cluster;
mod coordinators;
mod demo;
mod discover;
mod doctor;
mod faults;
mod fence;
mod multipath;
mod nvme;
mod pr;
mod quorum;
mod stress;
mod systemd;
mod topology;

/// Every suite, in the order they run.
pub const ALL: &[Suite] = &[
    topology::SUITE,
    demo::SUITE,
    pr::SUITE,
    discover::SUITE,
    doctor::SUITE,
    faults::SUITE,
    agent::SUITE,
    coordinators::SUITE,
    arrays::SUITE,
    bench::SUITE,
    stress::SUITE,
    fence::SUITE,
    multipath::SUITE,
    cluster::SUITE,
    quorum::SUITE,
    systemd::SUITE,
    bench_agent::SUITE,
    nvme::SUITE,
    fence::SUITE_DEBIAN13,
    multipath::SUITE_DEBIAN13,
    cluster::SUITE_DEBIAN13,
    quorum::SUITE_DEBIAN13,
    bench::SUITE_DEBIAN13,
];
