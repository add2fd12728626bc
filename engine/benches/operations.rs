//! The engine's CPU cost per LU (`cargo bench -p prfence-engine --features test-support`; not
//! run by `cargo test`): unfence, status and fence of N LUs against the in-memory SPC model, so
//! what is timed is prfence's own work (planning, the fan-out's threads, encoding, decoding,
//! judging) plus the model's, with no wire and no kernel. Prints microseconds per operation and
//! per LU, the best of several rounds.

use std::time::{Duration, Instant};

use prfence_engine::exec::ScsiPr;
use prfence_engine::ops::{self, Limits, LuTarget, TieBreak};
use prfence_engine::pr::Key;
use prfence_engine::spc_model::{ModelDevice, Quirks};
use prfence_engine::testing::{Cluster, Medium, Port, TargetModel};
use prfence_engine::transport::Policy;

const ROUNDS: usize = 5;
const A: Key = Key::new(0xa);
const B: Key = Key::new(0xb);

fn limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(60),
        tie_break: TieBreak::Off,
    }
}

fn targets(cluster: &Cluster, node: usize) -> Vec<LuTarget<ScsiPr<ModelDevice>>> {
    cluster.targets(node, |p| match (p.medium, p.port) {
        (Medium::Scsi(lu), Port::Nexus(nexus)) => {
            ScsiPr::new(ModelDevice::new(lu, nexus, p.device), Policy::default())
        }
        _ => panic!("an SPC cluster has SCSI paths only"),
    })
}

/// Best of [`ROUNDS`]: `setup` (untimed) makes a fresh cluster, `op` runs on it.
fn bench(name: &str, lus: usize, setup: impl Fn() -> Cluster, op: impl Fn(&Cluster)) {
    let mut best = Duration::MAX;
    for _ in 0..ROUNDS {
        let cluster = setup();
        let start = Instant::now();
        op(&cluster);
        best = best.min(start.elapsed());
    }
    let us = best.as_secs_f64() * 1e6;
    println!(
        "{name:<28} {lus:>5} LUs {us:>11.1} µs {:>9.1} µs per LU",
        us / lus as f64
    );
}

fn main() {
    println!("prfence-engine against the SPC model, one path per LU and node (best of {ROUNDS})");
    for lus in [1usize, 16, 64, 256] {
        let fresh = || Cluster::new(TargetModel::Scsi(Quirks::default()), lus, &[1, 1]);
        let both_registered = || {
            let cluster = fresh();
            for (node, key) in [(0, A), (1, B)] {
                let report = ops::unfence(targets(&cluster, node), key, limits());
                assert!(
                    report.is_ok_and(|r| r.outcome == ops::Outcome::Success),
                    "unfence"
                );
            }
            cluster
        };
        bench("unfence", lus, fresh, |c| {
            let report = ops::unfence(targets(c, 0), A, limits());
            assert!(report.is_ok_and(|r| r.outcome == ops::Outcome::Success));
        });
        bench("status", lus, both_registered, |c| {
            let report = ops::status(targets(c, 0), A, limits());
            assert!(report.is_ok());
        });
        bench("fence (smaller key)", lus, both_registered, |c| {
            let report = ops::fence(targets(c, 0), A, B, limits());
            assert!(report.is_ok_and(|r| r.outcome == ops::Outcome::Success));
        });
    }
}
