//! The NVMe policy against a model of Linux nvmet's reservation rules (drivers/nvme/target/pr.c
//! as described in the design notes, not its code): registrants by host id, the generation
//! bumped by register/preempt/clear, and the kernel's NVMe `pr_ops` on top (RREGA from `old`,
//! status mapping to `pr_status`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::*;
use crate::pr::nvme::HostId;
use crate::pr::{Key, ReservationType, TransportId};

const A: Key = Key::new(0xa);
const B: Key = Key::new(0xb);
const WERO: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;
const WEAR: ReservationType = ReservationType::WriteExclusiveAllRegistrants;

type Host = [u8; 16];

/// What nvmet answers, before the kernel maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    Conflict,
    InvalidField,
}

/// One namespace's reservation state, shared by every host's fake device.
#[derive(Debug, Default)]
struct Namespace {
    /// In registration order.
    registrants: Vec<(Host, u64)>,
    holder: Option<Host>,
    /// NVMe RTYPE, 0 when none.
    rtype: u8,
    generation: u32,
    /// Every command that reached the namespace, for assertions: (host, what).
    log: Vec<(Host, String)>,
    /// Linux nvmet's rule (6.13–7.2): a PREEMPT from the holder of a single-holder reservation
    /// only changes its type, whatever PRKEY names. Off: the NVMe specification's rule.
    holder_preempt_changes_type_only: bool,
}

impl Namespace {
    fn key_of(&self, host: Host) -> Option<u64> {
        self.registrants
            .iter()
            .find(|(h, _)| *h == host)
            .map(|(_, k)| *k)
    }

    fn all_registrants(&self) -> bool {
        matches!(self.rtype, 5 | 6)
    }

    fn holds(&self, host: Host) -> bool {
        self.rtype != 0
            && (self.holder == Some(host) || self.all_registrants() && self.key_of(host).is_some())
    }

    fn drop_registrant(&mut self, host: Host) {
        self.registrants.retain(|(h, _)| *h != host);
        if self.holder == Some(host) || self.all_registrants() && self.registrants.is_empty() {
            if self.all_registrants() && !self.registrants.is_empty() {
                self.holder = self.registrants.first().map(|(h, _)| *h);
            } else {
                self.holder = None;
                self.rtype = 0;
            }
        }
    }

    /// Checks CRKEY unless IEKEY: the host must be registered with it.
    fn current(&self, host: Host, crkey: u64, iekey: bool) -> Result<u64, Answer> {
        match self.key_of(host) {
            Some(k) if iekey || k == crkey => Ok(k),
            _ => Err(Answer::Conflict),
        }
    }

    fn register(&mut self, host: Host, rrega: u8, iekey: bool, crkey: u64, nrkey: u64) -> Answer {
        let result = match rrega {
            0 => match self.key_of(host) {
                Some(k) if k == nrkey => Ok(()),
                Some(_) => Err(Answer::Conflict),
                None if nrkey == 0 => Err(Answer::InvalidField),
                None => {
                    self.registrants.push((host, nrkey));
                    Ok(())
                }
            },
            1 => self
                .current(host, crkey, iekey)
                .map(|_| self.drop_registrant(host)),
            2 => self.current(host, crkey, iekey).map(|_| {
                for r in &mut self.registrants {
                    if r.0 == host {
                        r.1 = nrkey;
                    }
                }
            }),
            _ => Err(Answer::InvalidField),
        };
        self.finish(result, true)
    }

    fn finish(&mut self, result: Result<(), Answer>, bump: bool) -> Answer {
        match result {
            Ok(()) => {
                if bump {
                    self.generation += 1;
                }
                Answer::Ok
            }
            Err(a) => a,
        }
    }

    fn acquire(&mut self, host: Host, racqa: u8, rtype: u8, crkey: u64, prkey: u64) -> Answer {
        if let Err(a) = self.current(host, crkey, false) {
            return a;
        }
        match racqa {
            0 => {
                let result = if self.rtype == 0 {
                    self.holder = Some(host);
                    self.rtype = rtype;
                    Ok(())
                } else if self.holds(host) && self.rtype == rtype {
                    Ok(())
                } else {
                    Err(Answer::Conflict)
                };
                self.finish(result, false)
            }
            1 | 2
                if self.holder_preempt_changes_type_only
                    && self.holder == Some(host)
                    && !self.all_registrants() =>
            {
                self.rtype = rtype;
                self.finish(Ok(()), true)
            }
            1 | 2 => {
                let holder_key = self.holder.and_then(|h| self.key_of(h));
                let victims: Vec<Host> = self
                    .registrants
                    .iter()
                    .filter(|(h, k)| *k == prkey && *h != host)
                    .map(|(h, _)| *h)
                    .collect();
                let result = if self.rtype != 0 && holder_key == Some(prkey) {
                    for v in victims {
                        self.registrants.retain(|(h, _)| *h != v);
                    }
                    self.holder = Some(host);
                    self.rtype = rtype;
                    Ok(())
                } else if victims.is_empty() {
                    Err(Answer::Conflict)
                } else {
                    for v in victims {
                        self.drop_registrant(v);
                    }
                    Ok(())
                };
                self.finish(result, true)
            }
            _ => Answer::InvalidField,
        }
    }

    fn release(&mut self, host: Host, rrela: u8, rtype: u8, crkey: u64) -> Answer {
        if let Err(a) = self.current(host, crkey, false) {
            return a;
        }
        match rrela {
            0 => {
                let result = if !self.holds(host) {
                    Ok(())
                } else if self.rtype != rtype {
                    Err(Answer::Conflict)
                } else {
                    self.holder = None;
                    self.rtype = 0;
                    Ok(())
                };
                self.finish(result, false)
            }
            1 => {
                self.registrants.clear();
                self.holder = None;
                self.rtype = 0;
                self.finish(Ok(()), true)
            }
            _ => Answer::InvalidField,
        }
    }

    fn report(&self, format: ReportFormat) -> ReservationStatus {
        ReservationStatus {
            format,
            generation: self.generation,
            rtype: codec::scsi_type(self.rtype),
            ptpl: false,
            registrants: self
                .registrants
                .iter()
                .enumerate()
                .map(|(i, (h, k))| crate::pr::Registrant {
                    cntlid: u16::try_from(i + 1).unwrap(),
                    holder: self.holds(*h),
                    key: Key::new(*k),
                    host_id: match format {
                        ReportFormat::Extended => HostId::Extended(*h),
                        ReportFormat::Basic => {
                            HostId::Basic(u64::from_le_bytes(h[..8].try_into().unwrap()))
                        }
                    },
                })
                .collect(),
        }
    }
}

/// A failure to inject into the next call(s) of a fake device.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Errno(i32),
    Status(PrStatus),
    Nvme(NvmeStatus),
}

/// What the kernel on one host offers.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    /// Linux before ~6.19: no IOC_PR_READ_KEYS / IOC_PR_READ_RESERVATION.
    read_ioctls: bool,
    rescap: u8,
    /// The controller's Report format: nvmet answers only the extended one (EDS=1), a
    /// controller with 64-bit host ids only the original one.
    report: ReportFormat,
}

/// One host's `/dev/nvme0n1` over the shared namespace.
struct Fake {
    ns: Arc<Mutex<Namespace>>,
    host: Host,
    path: PathBuf,
    kernel: Kernel,
    faults: Mutex<VecDeque<Fault>>,
    /// Corrupts Report data (hostile controller).
    report_override: Mutex<Option<Vec<u8>>>,
}

use std::path::PathBuf;

impl Fake {
    fn fault(&self) -> Option<Fault> {
        self.faults.lock().unwrap().pop_front()
    }

    fn block(
        &self,
        what: &'static str,
        op: impl FnOnce(&mut Namespace) -> Answer,
    ) -> Result<PrResult<()>, nvme_io::Error> {
        match self.fault() {
            Some(Fault::Errno(errno)) => return Err(self.errno(what, errno)),
            Some(Fault::Status(status)) => return Ok(Err(status)),
            Some(Fault::Nvme(_)) | None => {}
        }
        let mut ns = self.ns.lock().unwrap();
        ns.log.push((self.host, what.to_owned()));
        match op(&mut ns) {
            Answer::Ok => Ok(Ok(())),
            Answer::Conflict => Ok(Err(PrStatus::RESERVATION_CONFLICT)),
            // The kernel maps Invalid Field to -EINVAL.
            Answer::InvalidField => Err(self.errno(what, nix::libc::EINVAL)),
        }
    }

    fn errno(&self, ioctl: &'static str, errno: i32) -> nvme_io::Error {
        nvme_io::Error::Ioctl {
            path: self.path.clone(),
            ioctl,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }
}

fn le64(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().unwrap())
}

impl NvmeDevice for Fake {
    fn path(&self) -> &Path {
        &self.path
    }
    fn pr_register(
        &self,
        old: u64,
        new: u64,
        ignore: bool,
    ) -> Result<PrResult<()>, nvme_io::Error> {
        let host = self.host;
        self.block("IOC_PR_REGISTER", |ns| {
            ns.register(host, if old != 0 { 2 } else { 0 }, ignore, old, new)
        })
    }
    fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::Error> {
        let host = self.host;
        self.block("IOC_PR_RESERVE", |ns| {
            ns.acquire(host, 0, u8::try_from(rtype.code()).unwrap(), key, 0)
        })
    }
    fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::Error> {
        let host = self.host;
        self.block("IOC_PR_RELEASE", |ns| {
            ns.release(host, 0, u8::try_from(rtype.code()).unwrap(), key)
        })
    }
    fn pr_preempt(
        &self,
        old: u64,
        new: u64,
        rtype: PrType,
        abort: bool,
    ) -> Result<PrResult<()>, nvme_io::Error> {
        let host = self.host;
        let name = if abort {
            "IOC_PR_PREEMPT_ABORT"
        } else {
            "IOC_PR_PREEMPT"
        };
        self.block(name, |ns| {
            ns.acquire(
                host,
                1 + u8::from(abort),
                u8::try_from(rtype.code()).unwrap(),
                old,
                new,
            )
        })
    }
    fn pr_clear(&self, key: u64) -> Result<PrResult<()>, nvme_io::Error> {
        let host = self.host;
        self.block("IOC_PR_CLEAR", |ns| ns.release(host, 1, 0, key))
    }
    fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, nvme_io::Error> {
        if !self.kernel.read_ioctls {
            return Err(self.errno("IOC_PR_READ_KEYS", nix::libc::ENOTTY));
        }
        match self.fault() {
            Some(Fault::Errno(errno)) => return Err(self.errno("IOC_PR_READ_KEYS", errno)),
            Some(Fault::Status(status)) => return Ok(Err(status)),
            _ => {}
        }
        let ns = self.ns.lock().unwrap();
        for (slot, (_, key)) in keys.iter_mut().zip(&ns.registrants) {
            *slot = *key;
        }
        Ok(Ok(PrKeys {
            generation: ns.generation,
            num_keys: u32::try_from(ns.registrants.len()).unwrap(),
        }))
    }
    fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, nvme_io::Error> {
        if !self.kernel.read_ioctls {
            return Err(self.errno("IOC_PR_READ_RESERVATION", nix::libc::EOPNOTSUPP));
        }
        let ns = self.ns.lock().unwrap();
        // The kernel reports the first holder's key, whatever the type.
        let key = ns
            .registrants
            .iter()
            .find(|(h, _)| ns.holds(*h))
            .map_or(0, |(_, k)| *k);
        Ok(Ok(PrReservation {
            key,
            generation: ns.generation,
            rtype: u32::from(ns.rtype),
        }))
    }
    fn nsid(&self) -> Result<u32, nvme_io::Error> {
        Ok(1)
    }
    fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: DataTransfer<'_>,
        _timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::Error> {
        let done = |status| Ok(NvmeCompletion { status, result: 0 });
        match self.fault() {
            Some(Fault::Errno(errno)) => return Err(self.errno("NVME_IOCTL_IO_CMD", errno)),
            Some(Fault::Nvme(status)) => return done(status),
            Some(Fault::Status(_)) | None => {}
        }
        assert_eq!(command.nsid, 1);
        let answer = |a| match a {
            Answer::Ok => NvmeStatus::SUCCESS,
            Answer::Conflict => NvmeStatus(0x4000 | NvmeStatus::RESERVATION_CONFLICT.0),
            Answer::InvalidField => NvmeStatus::INVALID_FIELD,
        };
        let mut ns = self.ns.lock().unwrap();
        match (command.opcode, data) {
            (codec::RESERVATION_REGISTER, DataTransfer::ToDevice(d)) => {
                let rrega = u8::try_from(command.cdw10 & 7).unwrap();
                let iekey = command.cdw10 & 8 != 0;
                ns.log.push((self.host, format!("Register RREGA={rrega}")));
                done(answer(ns.register(
                    self.host,
                    rrega,
                    iekey,
                    le64(d, 0),
                    le64(d, 8),
                )))
            }
            (codec::RESERVATION_REPORT, DataTransfer::FromDevice(buf)) => {
                let asked = if command.cdw11 & 1 == 0 {
                    ReportFormat::Basic
                } else {
                    ReportFormat::Extended
                };
                ns.log.push((self.host, format!("Report {asked:?}")));
                if asked != self.kernel.report {
                    return done(NvmeStatus::HOST_ID_INCONSISTENT);
                }
                let len = usize::try_from(command.cdw10 + 1).unwrap() * 4;
                assert!(len <= buf.len());
                let bytes = self
                    .report_override
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or_else(|| ns.report(asked).encode());
                let n = bytes.len().min(len);
                buf[..n].copy_from_slice(&bytes[..n]);
                done(NvmeStatus::SUCCESS)
            }
            (opcode, _) => panic!("unexpected passthrough opcode {opcode:#x}"),
        }
    }
    fn admin_passthru(
        &self,
        command: &NvmeCommand,
        data: DataTransfer<'_>,
        _timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::Error> {
        assert_eq!((command.opcode, command.cdw10), (codec::IDENTIFY, 0));
        let DataTransfer::FromDevice(buf) = data else {
            panic!("Identify reads");
        };
        buf[31] = self.kernel.rescap;
        Ok(NvmeCompletion {
            status: NvmeStatus::SUCCESS,
            result: 0,
        })
    }
}

fn quick() -> Policy {
    Policy {
        not_ready_backoff: Duration::from_millis(1),
        ..Policy::default()
    }
}

const NEW_KERNEL: Kernel = Kernel {
    read_ioctls: true,
    rescap: 0x7e,
    report: ReportFormat::Extended,
};
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
    NvmePr::new(
        Fake {
            ns: Arc::clone(ns),
            host: [id; 16],
            path: PathBuf::from(path),
            kernel,
            faults: Mutex::new(VecDeque::new()),
            report_override: Mutex::new(None),
        },
        quick(),
    )
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
    fn registered(&self) -> Vec<(Host, u64)> {
        self.ns.lock().unwrap().registrants.clone()
    }
    fn last(&self) -> String {
        self.ns.lock().unwrap().log.last().unwrap().1.clone()
    }
}

fn inject(path: &NvmePr<Fake>, fault: Fault) {
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
    assert_eq!(s.last(), "IOC_PR_PREEMPT_ABORT");
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
        inject(&s.a, Fault::Errno(errno));
        let e = s.a.pr_out(&PrOut::register(Key::ZERO, A)).unwrap_err();
        assert_eq!(e.kind, kind, "errno {errno}: {e}");
        assert!(e.to_string().contains("IOC_PR_REGISTER"), "{e}");
    }
    let s = setup(NEW_KERNEL);
    inject(&s.a, Fault::Errno(nix::libc::EPERM));
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
    inject(&s.a, Fault::Errno(nix::libc::EACCES));
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
        inject(&s.a, Fault::Status(status));
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
        inject(&s.a, Fault::Nvme(status));
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
    inject(&s.a, Fault::Errno(nix::libc::EOPNOTSUPP));
    assert_eq!(s.a.read_keys().unwrap().keys, vec![A]);
    // EPERM is not a missing ioctl: no fallback.
    inject(&s.a, Fault::Errno(nix::libc::EPERM));
    assert_eq!(s.a.read_keys().unwrap_err().kind, ErrorKind::Open);
}

#[test]
fn namespace_not_ready_is_retried_and_a_pr_out_is_reread_first() {
    let s = setup(NEW_KERNEL);
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    // Not ready, and the unregister has not applied: retried, then done.
    inject(&s.a, Fault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
    let report = s.a.pr_out(&PrOut::unregister(A)).unwrap();
    assert!(!report.confirmed_by_reread);
    assert!(s.registered().is_empty());
    // Not ready after it applied (another path of ours did it): the re-read confirms it.
    s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
    s.ns.lock().unwrap().registrants.clear();
    inject(&s.a, Fault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
    let report = s.a.pr_out(&PrOut::unregister(A)).unwrap();
    assert!(report.confirmed_by_reread);
    // For ever not ready: gives up with its kind.
    let old = setup(OLD_KERNEL);
    for _ in 0..10 {
        inject(&old.a, Fault::Nvme(NvmeStatus::NAMESPACE_NOT_READY));
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
    assert_eq!(s.registered(), vec![([0xaa; 16], 0xa)], "B is gone");
    let r = s.b.read_reservation().unwrap().reservation.unwrap();
    assert_eq!(
        (r.key, r.rtype),
        (Key::ZERO, WEAR),
        "held by every registrant: A alone"
    );
    let log: Vec<String> =
        s.ns.lock()
            .unwrap()
            .log
            .iter()
            .map(|(_, w)| w.clone())
            .collect();
    assert_eq!(
        log[log.len() - 3..],
        [
            "IOC_PR_PREEMPT_ABORT",
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
            tie_break: Duration::ZERO,
        }
    }

    /// Host `id`'s view of the namespaces, as fresh paths (the engine takes them by value).
    fn targets(namespaces: &[Arc<Mutex<Namespace>>], id: u8) -> Vec<LuTarget<NvmePr<Fake>>> {
        namespaces
            .iter()
            .enumerate()
            .map(|(i, ns)| LuTarget {
                id: format!("uuid.0000000{i}"),
                paths: vec![host(ns, id, &format!("/dev/nvme{i}n1"), NEW_KERNEL)],
            })
            .collect()
    }

    #[test]
    fn doctor_matches_an_nvme_path_to_its_host_registration() {
        use crate::ops::doctor::{DoctorPath, PathFacts, PathRegistration, TargetKind, doctor};
        let namespaces = vec![Arc::new(Mutex::new(Namespace::default()))];
        for (id, key) in [(0xaa, A), (0xbb, B)] {
            ops::unfence(targets(&namespaces, id), key, limits()).unwrap();
        }
        let facts = |host: &str| PathFacts {
            nvme_host_id: Some(host.to_string()),
            target: Some(TargetKind::Unknown),
            ..PathFacts::default()
        };
        let lus = |host: &str| {
            targets(&namespaces, 0xaa)
                .into_iter()
                .map(|lu| LuTarget {
                    id: lu.id,
                    paths: lu
                        .paths
                        .into_iter()
                        .map(|transport| DoctorPath {
                            transport,
                            facts: facts(host),
                        })
                        .collect(),
                })
                .collect::<Vec<_>>()
        };
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
    fn unfence_fence_and_status_work_on_nvme() {
        let namespaces: Vec<_> = (0..2)
            .map(|_| Arc::new(Mutex::new(Namespace::default())))
            .collect();
        for (id, key) in [(0xaa, A), (0xbb, B)] {
            let report = ops::unfence(targets(&namespaces, id), key, limits()).unwrap();
            assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        }
        for ns in &namespaces {
            let ns = ns.lock().unwrap();
            assert_eq!(ns.registrants.len(), 2);
            assert_eq!((ns.holder, ns.rtype), (Some([0xaa; 16]), 3));
        }
        let report = ops::fence(targets(&namespaces, 0xaa), A, B, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Success, "{report:?}");
        for ns in &namespaces {
            let ns = ns.lock().unwrap();
            assert_eq!(ns.registrants, vec![([0xaa; 16], 0xa)]);
            assert_eq!(ns.holder, Some([0xaa; 16]));
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
