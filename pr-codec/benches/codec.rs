//! The codec's CPU cost per command (`cargo bench -p pr-codec`; not run by `cargo test`): what
//! prfence spends in encoding and decoding, next to the milliseconds a PR command takes on the
//! wire. Prints nanoseconds per call, the best of several rounds (no statistics crate: the
//! figures are for orders of magnitude, not regressions of a few percent).

use std::hint::black_box;
use std::time::{Duration, Instant};

use pr_codec::nvme::{ReportFormat, ReservationStatus};
use pr_codec::response::{FullStatus, ReadKeys, Registration};
use pr_codec::{
    Key, PrInAction, PrOut, PrOutAction, Registrant, ReservationType, Scope, TransportId,
    pr_in_cdb, pr_out_cdb,
};

const ROUNDS: usize = 7;
const ROUND: Duration = Duration::from_millis(100);

/// Runs `f` in rounds of about [`ROUND`] and prints the best round's time per call.
fn bench(name: &str, mut f: impl FnMut()) {
    // calls per round, from a first timing
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < ROUND / 10 {
        f();
        calls += 1;
    }
    let per_round = (calls * 10).max(1);
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..per_round {
            f();
        }
        best = best.min(start.elapsed().as_nanos() as f64 / per_round as f64);
    }
    println!("{name:<52} {best:>10.1} ns");
}

fn iscsi(node: &str) -> TransportId {
    TransportId::Iscsi {
        name: format!("iqn.2026-11.org.prfence.lab:{node}"),
        isid: Some("23d000000".to_owned()),
    }
}

fn full_status(registrations: usize) -> Vec<u8> {
    FullStatus {
        generation: 7,
        registrations: (0..registrations)
            .map(|i| Registration {
                key: Key::new(0xa + i as u64),
                all_tg_pt: false,
                holder: i == 0,
                scope: (i == 0).then_some(Scope::LogicalUnit),
                rtype: (i == 0).then_some(ReservationType::WriteExclusiveRegistrantsOnly),
                relative_target_port: 1,
                transport_id: iscsi(&format!("node-{i}")),
            })
            .collect(),
    }
    .encode()
}

fn main() {
    let (ours, victim) = (Key::new(0xb), Key::new(0xa));
    let rtype = ReservationType::WriteExclusiveRegistrantsOnly;
    println!("pr-codec, per call (best of {ROUNDS} rounds)");
    bench("PR IN CDB (READ KEYS)", || {
        black_box(pr_in_cdb(black_box(PrInAction::ReadKeys), 1024));
    });
    bench("PR OUT CDB + parameters (PREEMPT AND ABORT)", || {
        let out = PrOut::preempt_and_abort(black_box(ours), black_box(victim), rtype);
        let encoded = out.encode();
        black_box(pr_out_cdb(PrOutAction::PreemptAndAbort, Some(rtype), 24));
        let _ = black_box(encoded);
    });
    for keys in [2usize, 8, 64] {
        let bytes = ReadKeys {
            generation: 3,
            keys: (0..keys).map(|k| Key::new(k as u64 + 1)).collect(),
        }
        .encode();
        bench(&format!("READ KEYS response, {keys} keys: decode"), || {
            let _ = black_box(ReadKeys::decode(black_box(&bytes)));
        });
    }
    for registrations in [2usize, 8] {
        let bytes = full_status(registrations);
        bench(
            &format!("READ FULL STATUS, {registrations} iSCSI registrations: decode"),
            || {
                let _ = black_box(FullStatus::decode(black_box(&bytes)));
            },
        );
    }
    let report = ReservationStatus {
        format: ReportFormat::Extended,
        generation: 5,
        rtype: Some(rtype),
        ptpl: false,
        registrants: (0..4u8)
            .map(|i| Registrant {
                cntlid: u16::from(i),
                holder: i == 0,
                key: Key::new(0xa + u64::from(i)),
                host_id: pr_codec::host_id::HostId::Extended([i; 16]),
            })
            .collect(),
    }
    .encode();
    bench("NVMe Reservation Report, 4 registrants: decode", || {
        let _ = black_box(ReservationStatus::decode(black_box(&report)));
    });
}
