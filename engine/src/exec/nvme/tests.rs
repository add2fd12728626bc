//! The NVMe policy against a model of Linux nvmet's reservation rules (drivers/nvme/target/pr.c
//! as described in the design notes, not its code): registrants by host id, the generation
//! bumped by register/preempt/clear, and the kernel's NVMe `pr_ops` on top (RREGA from `old`,
//! status mapping to `pr_status`).

use std::sync::{Arc, Mutex};

use super::*;

use crate::pr::nvme::HostId;
use crate::pr::{Key, ReservationType, TransportId};
use crate::testing::nvmet::{Fake, Kernel, Namespace, NvmetFault, NvmetHost};

const A: Key = Key::new(0xa);
const B: Key = Key::new(0xb);
const WERO: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;
const WEAR: ReservationType = ReservationType::WriteExclusiveAllRegistrants;

fn quick() -> Policy {
    Policy {
        not_ready_backoff: Duration::from_millis(1),
        ..Policy::default()
    }
}

const NEW_KERNEL: Kernel = Kernel::CURRENT;
const OLD_KERNEL: Kernel = Kernel {
    read_ioctls: false,
    rescap: 0x7e,
    report: ReportFormat::Extended,
};

struct Setup {
    ns: Arc<Mutex<Namespace>>,
    a: NvmePr<Fake>,
    b: NvmePr<Fake>,
}

fn host(ns: &Arc<Mutex<Namespace>>, id: u8, path: &str, kernel: Kernel) -> NvmePr<Fake> {
    NvmePr::new(Fake::new(Arc::clone(ns), [id; 16], path, kernel), quick())
}

fn setup(kernel: Kernel) -> Setup {
    let ns = Arc::new(Mutex::new(Namespace::default()));
    Setup {
        a: host(&ns, 0xaa, "/dev/nvme0n1", kernel),
        b: host(&ns, 0xbb, "/dev/nvme1n1", kernel),
        ns,
    }
}

impl Setup {
    fn registered(&self) -> Vec<(NvmetHost, u64)> {
        self.ns.lock().unwrap().registrants.clone()
    }
    fn last(&self) -> String {
        self.ns.lock().unwrap().log.last().unwrap().1.clone()
    }
}

fn inject(path: &NvmePr<Fake>, fault: NvmetFault) {
    path.device.faults.lock().unwrap().push_back(fault);
}

#[test]
fn the_mapping_table() {
    let table = [
        (
            PrOut::register(Key::ZERO, A),
            NvmeOp::Register {
                old: Key::ZERO,
                new: A,
                ignore_key: false,
            },
        ),
        (
            PrOut::register(A, B),
            NvmeOp::Register {
                old: A,
                new: B,
                ignore_key: false,
            },
        ),
        (
            PrOut::unregister(A),
            NvmeOp::Unregister {
                key: A,
                ignore_key: false,
            },
        ),
        (
            PrOut::register_ignore(A),
            NvmeOp::RegisterIgnoringKey { new: A },
        ),
        (
            PrOut::register_ignore(Key::ZERO),
            NvmeOp::Unregister {
                key: Key::ZERO,
                ignore_key: true,
            },
        ),
        (
            PrOut::reserve(A, WERO),
            NvmeOp::Reserve {
                key: A,
                rtype: WERO,
            },
        ),
        (
            PrOut::release(A, WERO),
            NvmeOp::Release {
                key: A,
                rtype: WERO,
            },
        ),
        (PrOut::clear(A), NvmeOp::Clear { key: A }),
        (
            PrOut::preempt(A, B, WERO),
            NvmeOp::Preempt {
                key: A,
                victim: B,
                rtype: WERO,
                abort: false,
            },
        ),
        (
            PrOut::preempt_and_abort(A, B, WERO),
            NvmeOp::Preempt {
                key: A,
                victim: B,
                rtype: WERO,
                abort: true,
            },
        ),
        // APTPL is accepted: persistence is the target's.
        (
            PrOut::register(Key::ZERO, A).with_aptpl(true),
            NvmeOp::Register {
                old: Key::ZERO,
                new: A,
                ignore_key: false,
            },
        ),
    ];
    for (request, op) in table {
        assert_eq!(plan(&request), Ok(op), "{request:?}");
    }
    assert!(plan(&PrOut::register_ignore(A).with_all_tg_pt(true)).is_err());
    let tid = TransportId::Sas { address: 1 };
    assert!(plan(&PrOut::register(Key::ZERO, A).with_spec_i_pt(vec![tid])).is_err());
}

#[test]
fn register_reserve_preempt_and_read_back() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register(Key::ZERO, B)).unwrap();
    s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap();
    let keys = s.b.read_keys().unwrap();
    assert_eq!(keys.keys, vec![A, B]);
    assert_eq!(keys.generation, 2);
    let r = s.b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype, r.scope), (A, WERO, Scope::LogicalUnit));
    // B fences A: A's key is gone, B holds.
    s.b.pr_out(&PrOut::preempt_and_abort(B, A, WERO)).unwrap();
    // the PREEMPT AND ABORT, then one Report: was the victim removed?
    let log = s.ns.lock().unwrap().log.clone();
    assert_eq!(log[log.len() - 2].1, "IOC_PR_PREEMPT_ABORT");
    assert_eq!(s.last(), "Report Extended");
    assert_eq!(s.a.read_keys().unwrap().keys, vec![B]);
    let r = s.a.read_reservation().unwrap().reservation.unwrap();
    assert_eq!(r.key, B);
    // A's next reservation command conflicts, and says so.
    let e = s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ReservationConflict);
    assert_eq!(
        e.transport,
        Some(TransportDetail::Nvme(NvmeDetail::Block(
            PrStatus::RESERVATION_CONFLICT
        )))
    );
    let text = e.to_string();
    assert!(
        text.contains("/dev/nvme0n1")
            && text.contains("RESERVE")
            && text.contains("RESERVATION CONFLICT (PR status 0x18)"),
        "{text}"
    );
    // Release by the holder, then clear.
    s.b.pr_out(&PrOut::release(B, WERO)).unwrap();
    assert_eq!(s.a.read_reservation().unwrap().reservation, None);
    s.b.pr_out(&PrOut::clear(B)).unwrap();
    assert!(s.a.read_keys().unwrap().keys.is_empty());
}

#[test]
fn register_and_ignore_existing_key_registers_or_replaces() {
    let s = setup(NEW_KERNEL);
    // Not registered: the replace conflicts, the register succeeds.
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xa)]);
    // Registered with another key: the replace with IEKEY changes it in one command.
    let before = s.ns.lock().unwrap().log.len();
    s.a.pr_out(&PrOut::register_ignore(B)).unwrap();
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xb)]);
    assert_eq!(s.ns.lock().unwrap().log.len(), before + 1);
    // Registered with the same key: idempotent.
    s.a.pr_out(&PrOut::register_ignore(B)).unwrap();
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xb)]);
}

#[test]
fn unregister_goes_through_passthrough() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    // With the wrong key: conflict, with the NVMe status in words.
    let e = s.a.pr_out(&PrOut::unregister(B)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ReservationConflict);
    assert!(
        e.to_string()
            .contains("RESERVATION CONFLICT (SCT 0h SC 83h, DNR)"),
        "{e}"
    );
    s.a.pr_out(&PrOut::unregister(A)).unwrap();
    assert_eq!(s.last(), "Register RREGA=1");
    assert_eq!(s.registered(), vec![([0xbb; 16], 0xb)]);
    // REGISTER AND IGNORE EXISTING KEY with key 0 unregisters whatever the key.
    s.b.pr_out(&PrOut::register_ignore(Key::ZERO)).unwrap();
    assert!(s.registered().is_empty());
}

#[test]
fn the_probe_tells_registered_from_not() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    assert!(crate::ops::probe_registration(&s.a, A).unwrap());
    assert!(!crate::ops::probe_registration(&s.a, B).unwrap());
    assert!(!crate::ops::probe_registration(&s.b, A).unwrap());
}

#[test]
fn all_registrants_report_key_zero_like_spc() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.a.pr_out(&PrOut::reserve(A, WEAR)).unwrap();
    for path in [&s.a, &s.b] {
        let r = path.read_reservation().unwrap().reservation.unwrap();
        assert_eq!((r.key, r.rtype), (Key::ZERO, WEAR));
    }
    let old = setup(OLD_KERNEL);
    *old.ns.lock().unwrap() = std::mem::take(&mut *s.ns.lock().unwrap());
    let r = old.a.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (Key::ZERO, WEAR));
    let full = old.a.read_full_status().unwrap();
    assert!(
        full.registrations
            .iter()
            .all(|r| r.holder && r.rtype == Some(WEAR))
    );
}

#[test]
fn old_kernels_read_through_the_passthrough_report() {
    let s = setup(OLD_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.b.pr_out(&PrOut::reserve(B, WERO)).unwrap();
    let keys = s.a.read_keys().unwrap();
    assert_eq!((keys.keys, keys.generation), (vec![A, B], 2));
    let r = s.a.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (B, WERO));
}

#[test]
fn full_status_names_hosts_by_host_id() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.b.pr_out(&PrOut::reserve(B, WERO)).unwrap();
    let full = s.a.read_full_status().unwrap();
    assert_eq!(full.generation, 2);
    let [a, b] = &full.registrations[..] else {
        panic!("{full:?}");
    };
    assert_eq!((a.key, a.holder, a.rtype), (A, false, None));
    assert_eq!((b.key, b.holder, b.rtype), (B, true, Some(WERO)));
    assert_eq!(b.scope, Some(Scope::LogicalUnit));
    assert_eq!(
        b.transport_id,
        TransportId::NvmeHostId {
            host_id: HostId::Extended([0xbb; 16])
        }
    );
    assert_eq!(
        b.transport_id.to_string(),
        "nvme-hostid:bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"
    );
}

#[test]
fn a_controller_with_64_bit_host_ids_gets_the_original_report_from_then_on() {
    let s = setup(Kernel {
        report: ReportFormat::Basic,
        ..OLD_KERNEL
    });
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    let full = s.a.read_full_status().unwrap();
    assert_eq!(
        full.registrations[1].transport_id.to_string(),
        "nvme-hostid:0xbbbbbbbbbbbbbbbb"
    );
    assert_eq!(s.a.read_keys().unwrap().keys, vec![A, B]);
    let reports: Vec<String> =
        s.ns.lock()
            .unwrap()
            .log
            .iter()
            .filter(|(h, what)| *h == [0xaa; 16] && what.starts_with("Report"))
            .map(|(_, what)| what.clone())
            .collect();
    assert_eq!(reports, ["Report Extended", "Report Basic", "Report Basic"]);
}

#[test]
fn many_registrants_are_read_by_reissuing_larger() {
    for kernel in [NEW_KERNEL, OLD_KERNEL] {
        let ns = Arc::new(Mutex::new(Namespace::default()));
        let hosts: Vec<_> = (0..200u8)
            .map(|i| host(&ns, i, "/dev/nvme0n1", kernel))
            .collect();
        for (i, h) in (0u64..).zip(&hosts) {
            h.pr_out(&PrOut::register_ignore(Key::new(0x100 + i)))
                .unwrap();
        }
        let keys = hosts[0].read_keys().unwrap().keys;
        assert_eq!(
            keys.len(),
            200,
            "more than the first buffer's 128 keys / 15 registrants"
        );
        assert_eq!(keys[199], Key::new(0x100 + 199));
        assert_eq!(
            hosts[0].read_full_status().unwrap().registrations.len(),
            200
        );
    }
}

#[test]
fn capabilities_come_from_rescap() {
    let s = setup(NEW_KERNEL);
    let caps = s.a.report_capabilities().unwrap();
    assert_eq!(caps.supported_types, Some(ReservationType::ALL.to_vec()));
    assert!(caps.tmv && !caps.ptpl_c && !caps.sip_c && !caps.atp_c);
    let none = setup(Kernel {
        rescap: 0,
        ..NEW_KERNEL
    });
    let e = none.a.report_capabilities().unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotSupported);
    assert!(e.message.contains("RESCAP"), "{e}");
}

#[test]
fn register_and_move_and_spec_i_pt_are_not_supported_in_plain_words() {
    let s = setup(NEW_KERNEL);
    let destination = crate::pr::RegisterMove {
        unreg: false,
        relative_target_port: 1,
        transport_id: TransportId::Sas { address: 1 },
    };
    let e =
        s.a.pr_out(&PrOut::register_and_move(A, B, WERO, destination))
            .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotSupported);
    assert!(
        e.to_string().contains("NVMe has no REGISTER AND MOVE"),
        "{e}"
    );
    assert!(s.ns.lock().unwrap().log.is_empty(), "nothing was sent");
}

#[test]
fn kernel_refusals_are_classified() {
    let cases = [
        (nix::libc::EINVAL, ErrorKind::InvalidField),
        (nix::libc::EOPNOTSUPP, ErrorKind::NotSupported),
        (nix::libc::ENOTTY, ErrorKind::NotSupported),
        (nix::libc::EPERM, ErrorKind::Open),
        (nix::libc::EACCES, ErrorKind::Open),
        (nix::libc::EIO, ErrorKind::Transport),
        (nix::libc::ENOLINK, ErrorKind::Transport),
        (nix::libc::ETIMEDOUT, ErrorKind::Timeout),
    ];
    for (errno, kind) in cases {
        let s = setup(NEW_KERNEL);
        inject(&s.a, NvmetFault::Errno(errno));
        let e = s.a.pr_out(&PrOut::register(Key::ZERO, A)).unwrap_err();
        assert_eq!(e.kind, kind, "errno {errno}: {e}");
        assert!(e.to_string().contains("IOC_PR_REGISTER"), "{e}");
    }
    let s = setup(NEW_KERNEL);
    inject(&s.a, NvmetFault::Errno(nix::libc::EPERM));
    let text =
        s.a.pr_out(&PrOut::reserve(A, WERO))
            .unwrap_err()
            .to_string();
    assert_eq!(
        text,
        "/dev/nvme0n1: PERSISTENT RESERVE OUT (RESERVE) failed: IOC_PR_RESERVE: Operation not \
         permitted (os error 1); block PR ioctls that change reservations need CAP_SYS_ADMIN on \
         the read-only open prfence uses; run as root"
    );
    inject(&s.a, NvmetFault::Errno(nix::libc::EACCES));
    let text = s.a.pr_out(&PrOut::unregister(A)).unwrap_err().to_string();
    assert!(text.contains("passthrough needs CAP_SYS_ADMIN"), "{text}");
}

#[test]
fn device_statuses_are_classified() {
    let s = setup(NEW_KERNEL);
    for (status, kind) in [
        (PrStatus::PATH_FAILED, ErrorKind::Transport),
        (PrStatus::PATH_FAST_FAILED, ErrorKind::Transport),
        (PrStatus::RETRY_PATH_FAILURE, ErrorKind::Transport),
        (PrStatus::IOERR, ErrorKind::Failed),
        (
            PrStatus::RESERVATION_CONFLICT,
            ErrorKind::ReservationConflict,
        ),
    ] {
        inject(&s.a, NvmetFault::Status(status));
        let e = s.a.read_keys().unwrap_err();
        assert_eq!(e.kind, kind, "{status}");
        assert_eq!(e.status_text(), Some(status.to_string()));
    }
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    for (status, kind) in [
        (NvmeStatus::INVALID_OPCODE, ErrorKind::NotSupported),
        (NvmeStatus::INVALID_FIELD, ErrorKind::InvalidField),
        (NvmeStatus::HOST_PATH_ERROR, ErrorKind::Transport),
        (NvmeStatus::ANA_INACCESSIBLE, ErrorKind::Transport),
        (NvmeStatus::INTERNAL_ERROR, ErrorKind::Failed),
    ] {
        inject(&s.a, NvmetFault::Nvme(status));
        let e = s.a.pr_out(&PrOut::unregister(A)).unwrap_err();
        assert_eq!(e.kind, kind, "{status}");
        assert_eq!(
            e.transport,
            Some(TransportDetail::Nvme(NvmeDetail::Passthru(status)))
        );
    }
}

#[test]
fn a_refused_read_ioctl_does_not_fall_back_but_a_missing_one_does() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    // EOPNOTSUPP from the ioctl: the Report is tried (and works on this namespace).
    inject(&s.a, NvmetFault::Errno(nix::libc::EOPNOTSUPP));
    assert_eq!(s.a.read_keys().unwrap().keys, vec![A]);
    // EPERM is not a missing ioctl: no fallback.
    inject(&s.a, NvmetFault::Errno(nix::libc::EPERM));
    assert_eq!(s.a.read_keys().unwrap_err().kind, ErrorKind::Open);
}

#[test]
fn namespace_not_ready_is_retried_and_a_pr_out_is_reread_first() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    // Not ready, and the unregister has not applied: retried, then done.
    inject(&s.a, NvmetFault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
    let report = s.a.pr_out(&PrOut::unregister(A)).unwrap();
    assert!(!report.confirmed_by_reread);
    assert!(s.registered().is_empty());
    // Not ready after it applied (another path of ours did it): the re-read confirms it.
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.ns.lock().unwrap().registrants.clear();
    inject(&s.a, NvmetFault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
    let report = s.a.pr_out(&PrOut::unregister(A)).unwrap();
    assert!(report.confirmed_by_reread);
    // For ever not ready: gives up with its kind.
    let old = setup(OLD_KERNEL);
    for _ in 0..10 {
        inject(&old.a, NvmetFault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
    }
    assert_eq!(old.a.read_keys().unwrap_err().kind, ErrorKind::NotReady);
}

#[test]
fn hostile_report_data_is_malformed_not_a_panic() {
    let s = setup(OLD_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    let mut bytes = s.ns.lock().unwrap().report(ReportFormat::Extended).encode();
    // An unknown reservation type.
    bytes[4] = 0x42;
    *s.a.device.report_override.lock().unwrap() = Some(bytes.clone());
    assert_eq!(s.a.read_keys().unwrap_err().kind, ErrorKind::Malformed);
    // REGCTL always larger than any buffer: bounded re-issue, then Malformed.
    bytes[4] = 0;
    bytes[5] = 0xff;
    bytes[6] = 0xff;
    *s.a.device.report_override.lock().unwrap() = Some(bytes);
    assert_eq!(
        s.a.read_full_status().unwrap_err().kind,
        ErrorKind::Malformed
    );
    // A short answer: zeros after it decode as an empty report, not garbage.
    *s.a.device.report_override.lock().unwrap() = Some(vec![1, 0, 0]);
    let keys = s.a.read_keys().unwrap();
    assert!(keys.keys.is_empty());
    // A holder-less reservation of a single-holder type.
    let mut held = Namespace::default().report(ReportFormat::Extended);
    held.rtype = Some(WERO);
    *s.a.device.report_override.lock().unwrap() = Some(held.encode());
    assert_eq!(
        s.a.read_reservation().unwrap_err().kind,
        ErrorKind::Malformed
    );
}

#[test]
fn no_events_are_returned() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.b.pr_out(&PrOut::preempt(B, A, WERO)).unwrap();
    let reply = s.a.execute(PrRequest::ReadKeys).unwrap();
    assert!(reply.events.is_empty());
    assert!(matches!(reply.answer, PrAnswer::Keys(k) if k.keys == vec![B]));
}

/// A and B registered, A holding WERO: the start of a fence from the holder.
fn holder_and_registrant(nvmet: bool) -> Setup {
    let s = setup(NEW_KERNEL);
    s.ns.lock().unwrap().holder_preempt_changes_type_only = nvmet;
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap();
    s
}

#[test]
fn a_holder_preempts_a_registrant_on_a_target_that_follows_the_specification() {
    let s = holder_and_registrant(false);
    s.a.pr_out(&PrOut::preempt_and_abort(A, B, WERO)).unwrap();
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xa)]);
    let r = s.a.read_reservation().unwrap().reservation.unwrap();
    // nothing to compensate: one PREEMPT, then the check that the victim is gone
    assert_eq!((r.key, r.rtype), (A, WERO));
    let preempts =
        s.ns.lock()
            .unwrap()
            .log
            .iter()
            .filter(|(_, w)| w.starts_with("IOC_PR_PREEMPT"))
            .count();
    assert_eq!(preempts, 1);
}

#[test]
fn a_holder_preempts_a_registrant_on_nvmet_through_the_all_registrants_twin() {
    let s = holder_and_registrant(true);
    s.a.pr_out(&PrOut::preempt_and_abort(A, B, WERO)).unwrap();
    let log: Vec<String> =
        s.ns.lock()
            .unwrap()
            .log
            .iter()
            .map(|(_, w)| w.clone())
            .collect();
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xa)], "B is gone");
    let r = s.b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!(
        (r.key, r.rtype),
        (Key::ZERO, WEAR),
        "held by every registrant: A alone"
    );
    // The check between the first PREEMPT and the twin's is one Report.
    assert_eq!(
        log[log.len() - 4..],
        [
            "IOC_PR_PREEMPT_ABORT",
            "Report Extended",
            "IOC_PR_PREEMPT",
            "IOC_PR_PREEMPT_ABORT"
        ],
        "{log:?}"
    );
    // B's writes: a non-registrant under WE-AR is refused, as under WE-RO.
    assert!(!s.ns.lock().unwrap().holds([0xbb; 16]));
}

#[test]
fn a_victim_that_preempted_first_makes_the_holder_lose_whole() {
    let s = holder_and_registrant(true);
    // B's fence ran first: A's key is gone and B holds.
    s.b.pr_out(&PrOut::preempt_and_abort(B, A, WERO)).unwrap();
    let e =
        s.a.pr_out(&PrOut::preempt_and_abort(A, B, WERO))
            .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ReservationConflict);
    assert_eq!(s.registered(), vec![([0xbb; 16], 0xb)]);
}

#[test]
fn under_write_exclusive_the_holder_is_told_the_target_ignored_its_preempt() {
    let s = setup(NEW_KERNEL);
    s.ns.lock().unwrap().holder_preempt_changes_type_only = true;
    let we = ReservationType::WriteExclusive;
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
    s.a.pr_out(&PrOut::reserve(A, we)).unwrap();
    let e = s.a.pr_out(&PrOut::preempt(A, B, we)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed);
    assert!(e.to_string().contains("still registered"), "{e}");
    // nothing was changed behind the admin's back: B registered, A holds WE
    assert_eq!(s.registered().len(), 2);
    let r = s.b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (A, we));
}

/// The engine's commands end to end on NVMe semantics: two namespaces, two hosts.
mod engine {
    use super::*;
    use crate::ops::{self, Limits, LuTarget, Outcome};

    fn limits() -> Limits {
        Limits {
            deadline: Duration::from_secs(20),
            tie_break: crate::ops::TieBreak::Off,
        }
    }

    /// NvmetHost `id`'s view of the namespaces, as fresh paths (the engine takes them by value).
    fn targets(namespaces: &[Arc<Mutex<Namespace>>], id: u8) -> Vec<LuTarget<NvmePr<Fake>>> {
        namespaces
            .iter()
            .enumerate()
            .map(|(i, ns)| LuTarget {
                id: format!("uuid.0000000{i}").into(),
                paths: vec![host(ns, id, &format!("/dev/nvme{i}n1"), NEW_KERNEL)],
            })
            .collect()
    }

    /// NvmetHost 0xaa's view for doctor, its paths saying this node's host id is `host`.
    fn doctor_lus(
        namespaces: &[Arc<Mutex<Namespace>>],
        host: &str,
    ) -> Vec<LuTarget<crate::ops::doctor::DoctorPath<NvmePr<Fake>>>> {
        use crate::ops::doctor::{DoctorPath, PathFacts, TargetKind};
        targets(namespaces, 0xaa)
            .into_iter()
            .map(|lu| LuTarget {
                id: lu.id,
                paths: lu
                    .paths
                    .into_iter()
                    .map(|transport| DoctorPath {
                        transport,
                        facts: PathFacts {
                            nvme_host_id: Some(host.to_string()),
                            target: Some(TargetKind::Unknown),
                            ..PathFacts::default()
                        },
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn doctor_matches_an_nvme_path_to_its_host_registration() {
        use crate::ops::doctor::{PathRegistration, doctor};
        let namespaces = vec![Arc::new(Mutex::new(Namespace::default()))];
        for (id, key) in [(0xaa, A), (0xbb, B)] {
            ops::unfence(targets(&namespaces, id), key, limits()).unwrap();
        }
        let lus = |host: &str| doctor_lus(&namespaces, host);
        let ours = "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
        let diagnosis = doctor(lus(ours), Some(A), Duration::from_secs(10)).unwrap();
        let path = &diagnosis.lus[0].paths[0];
        assert_eq!(
            path.registration,
            PathRegistration::Matched,
            "{diagnosis:?}"
        );
        assert_eq!(path.registered_key, Some(A));
        assert!(diagnosis.ready, "{diagnosis:?}");
        // Another host id: not registered.
        let other = "cccccccc-cccc-cccc-cccc-cccccccccccc";
        let diagnosis = doctor(lus(other), Some(A), Duration::from_secs(10)).unwrap();
        assert_eq!(
            diagnosis.lus[0].paths[0].registration,
            PathRegistration::NotRegistered
        );
    }

    #[test]
    fn doctor_names_a_host_id_shared_with_another_node() {
        use crate::ops::doctor::doctor;
        let namespaces = vec![Arc::new(Mutex::new(Namespace::default()))];
        // Two nodes with one host id: the second's unfence takes over the first's registration.
        ops::unfence(targets(&namespaces, 0xaa), A, limits()).unwrap();
        ops::unfence(targets(&namespaces, 0xaa), B, limits()).unwrap();
        assert_eq!(
            namespaces[0].lock().unwrap().registrants,
            vec![([0xaa; 16], 0xb)]
        );
        let lus = doctor_lus(&namespaces, "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa");
        let diagnosis = doctor(lus, Some(A), Duration::from_secs(10)).unwrap();
        assert!(!diagnosis.ready, "{diagnosis:?}");
        let findings: Vec<String> = diagnosis.lus[0]
            .findings
            .iter()
            .map(|f| format!("{} {}", f.message, f.remedy))
            .collect();
        assert!(
            findings
                .iter()
                .any(|f| f.contains("share this host id") && f.contains("/etc/nvme/hostid")),
            "{findings:#?}"
        );
    }

    /// Issue 24: what a fence sends each namespace, counted where nvmet would (the lab counts
    /// the same on nvmet: `nvme::reservation_commands_per_namespace_at_the_minimum`). The
    /// transport's Report after its PREEMPT is the fence's verification; only the holder, whose
    /// PREEMPT nvmet takes as a change of type, adds the twin's two Acquires and a Report.
    #[test]
    fn a_fence_sends_each_namespace_the_fewest_commands() {
        for (fencer, key, victim, holds) in [(0xbb, B, A, false), (0xaa, A, B, true)] {
            let namespaces = both_unfenced();
            for ns in &namespaces {
                let mut ns = ns.lock().unwrap();
                ns.log.clear();
                // As Linux nvmet does (a target that follows the specification needs no twin).
                ns.holder_preempt_changes_type_only = true;
            }
            fence_succeeds(&namespaces, fencer, key, victim);
            let sent: Vec<Vec<String>> = namespaces
                .iter()
                .map(|ns| {
                    ns.lock()
                        .unwrap()
                        .log
                        .iter()
                        .map(|(_, w)| w.clone())
                        .collect()
                })
                .collect();
            // A namespace but the arbiter: Report, PREEMPT AND ABORT, the transport's Report.
            // The arbiter (namespace 0): READ KEYS instead of the first Report, and READ KEYS
            // again after the fan-out (P2).
            let (arbiter, follower) = if holds { (7, 6) } else { (4, 3) };
            assert_eq!(
                sent.iter().map(Vec::len).collect::<Vec<_>>(),
                [arbiter, follower],
                "{sent:#?}"
            );
        }
    }

    /// The transport's look after the PREEMPT verifies only when nothing was sent since: on a
    /// namespace without a reservation the fence reserves after it, and the look that verifies
    /// (and must show that reservation) is a new one.
    #[test]
    fn a_reservation_made_after_the_preempt_is_verified_by_a_new_look() {
        let namespaces = both_unfenced();
        for ns in &namespaces {
            let mut ns = ns.lock().unwrap();
            assert_eq!(
                ns.release([0xaa; 16], 0, 3, A.get()),
                crate::testing::nvmet::NvmetAnswer::Ok
            );
            assert_eq!(ns.holder, None);
            ns.log.clear();
        }
        fence_succeeds(&namespaces, 0xbb, B, A);
        for ns in &namespaces {
            let ns = ns.lock().unwrap();
            assert_eq!(ns.holder, Some([0xbb; 16]));
            // The PREEMPT, the transport's Report, then the RESERVE and a new Report after it.
            let sent: Vec<&str> = ns.log.iter().map(|(_, w)| w.as_str()).collect();
            let at = |what: &str| sent.iter().position(|w| *w == what);
            let (preempt, reserve) = (at("IOC_PR_PREEMPT_ABORT"), at("IOC_PR_RESERVE"));
            assert!(preempt < reserve, "{sent:?}");
            assert_eq!(
                reserve.and_then(|r| sent.get(r + 1)),
                Some(&"Report Extended"),
                "{sent:?}"
            );
        }
    }

    /// Host `fencer`'s fence of `victim` with key `own` succeeds and leaves `own`, through
    /// `fencer`, the only registration on every namespace.
    fn fence_succeeds(namespaces: &[Arc<Mutex<Namespace>>], fencer: u8, own: Key, victim: Key) {
        let report = ops::fence(targets(namespaces, fencer), own, victim, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        for ns in namespaces {
            assert_eq!(
                ns.lock().unwrap().registrants,
                vec![([fencer; 16], own.get())]
            );
        }
    }

    /// Two namespaces with hosts 0xaa (key A, the holder: it unfenced first) and 0xbb (key B)
    /// registered on both.
    fn both_unfenced() -> Vec<Arc<Mutex<Namespace>>> {
        let namespaces: Vec<_> = (0..2)
            .map(|_| Arc::new(Mutex::new(Namespace::default())))
            .collect();
        for (id, key) in [(0xaa, A), (0xbb, B)] {
            let report = ops::unfence(targets(&namespaces, id), key, limits()).unwrap();
            assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        }
        namespaces
    }

    #[test]
    fn unfence_fence_and_status_work_on_nvme() {
        let namespaces = both_unfenced();
        for ns in &namespaces {
            let ns = ns.lock().unwrap();
            assert_eq!(ns.registrants.len(), 2);
            assert_eq!((ns.holder, ns.rtype), (Some([0xaa; 16]), 3));
        }
        fence_succeeds(&namespaces, 0xaa, A, B);
        for ns in &namespaces {
            assert_eq!(ns.lock().unwrap().holder, Some([0xaa; 16]));
        }
        // The fenced host cannot fence back: its key is gone from the arbiter.
        let report = ops::fence(targets(&namespaces, 0xbb), B, A, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::ThisNodeFenced, "{report:?}");
        assert_eq!(
            namespaces[0].lock().unwrap().registrants,
            vec![([0xaa; 16], 0xa)]
        );
        let report = ops::status(targets(&namespaces, 0xbb), B, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Off, "{report:?}");
        let report = ops::status(targets(&namespaces, 0xaa), A, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        // heal: nothing to repair for the survivor (one host registration covers its path), and
        // never a re-registration for the fenced host (P3).
        let report = ops::heal(targets(&namespaces, 0xaa), A, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        let report = ops::heal(targets(&namespaces, 0xbb), B, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::ThisNodeFenced, "{report:?}");
        let ns = namespaces[0].lock().unwrap();
        assert_eq!(ns.registrants, vec![([0xaa; 16], 0xa)]);
        assert_eq!(ns.holder, Some([0xaa; 16]));
    }
}

/// The kernel's IOC_PR_READ_RESERVATION costs the target two Reports; one passthrough Report
/// says the same. Where passthrough is refused (no CAP_SYS_ADMIN) the ioctl answers, and the
/// refusal is remembered.
#[test]
fn read_reservation_is_one_report_where_passthrough_is_allowed() {
    let reports = |s: &Setup| -> Vec<String> {
        s.ns.lock()
            .unwrap()
            .log
            .iter()
            .filter(|(_, what)| what.contains("Report"))
            .map(|(_, what)| what.clone())
            .collect()
    };
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap();
    s.ns.lock().unwrap().log.clear();
    let r = s.a.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (A, WERO));
    assert_eq!(reports(&s), ["Report Extended"]);
    // Refused passthrough: the ioctl, now and from then on.
    let b = &s.b;
    s.ns.lock().unwrap().log.clear();
    inject(b, NvmetFault::Errno(nix::libc::EACCES));
    let r = b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (A, WERO));
    let r = b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!((r.key, r.rtype), (A, WERO));
    assert_eq!(
        reports(&s),
        [
            "IOC_PR_READ_RESERVATION: Report (count)",
            "IOC_PR_READ_RESERVATION: Report",
            "IOC_PR_READ_RESERVATION: Report (count)",
            "IOC_PR_READ_RESERVATION: Report"
        ]
    );
}
