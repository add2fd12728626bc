//! A model of Linux nvmet's reservation rules (drivers/nvme/target/pr.c as described in the
//! design notes, not its code): registrants by host id, the generation bumped by register,
//! preempt and clear, and the kernel's NVMe `pr_ops` on top (RREGA from `old`, status mapping to
//! `pr_status`). [`Fake`] is one host's namespace block device over a shared [`Namespace`]. A test
//! double like the SPC model: never the proof of a behaviour, the lab is.

// Test support: a broken invariant of the model is a test failure, reported by a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvme_io::{
    NvmeCommand, NvmeCompletion, NvmeDataTransfer, NvmeStatus, PrKeys, PrReservation, PrResult,
    PrStatus, PrType,
};

use crate::exec::NvmeDevice;
use crate::pr::Key;
use crate::pr::nvme::{self as codec, HostId, ReportFormat, ReservationStatus};

/// A host's 128-bit host identifier: registrants are hosts, not paths.
pub type NvmetHost = [u8; 16];

/// What nvmet answers, before the kernel maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmetAnswer {
    Ok,
    Conflict,
    InvalidField,
}

/// One namespace's reservation state, shared by every host's fake device.
#[derive(Debug, Default)]
pub struct Namespace {
    /// In registration order.
    pub registrants: Vec<(NvmetHost, u64)>,
    pub holder: Option<NvmetHost>,
    /// NVMe RTYPE, 0 when none.
    pub rtype: u8,
    pub generation: u32,
    /// Every command that reached the namespace, for assertions: (host, what).
    pub log: Vec<(NvmetHost, String)>,
    /// Linux nvmet's rule (6.13–7.2): a PREEMPT from the holder of a single-holder reservation
    /// only changes its type, whatever PRKEY names. Off: the NVMe specification's rule.
    pub holder_preempt_changes_type_only: bool,
}

impl Namespace {
    pub fn key_of(&self, host: NvmetHost) -> Option<u64> {
        self.registrants
            .iter()
            .find(|(h, _)| *h == host)
            .map(|(_, k)| *k)
    }

    pub fn all_registrants(&self) -> bool {
        matches!(self.rtype, 5 | 6)
    }

    pub fn holds(&self, host: NvmetHost) -> bool {
        self.rtype != 0
            && (self.holder == Some(host) || self.all_registrants() && self.key_of(host).is_some())
    }

    pub fn drop_registrant(&mut self, host: NvmetHost) {
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
    pub fn current(&self, host: NvmetHost, crkey: u64, iekey: bool) -> Result<u64, NvmetAnswer> {
        match self.key_of(host) {
            Some(k) if iekey || k == crkey => Ok(k),
            _ => Err(NvmetAnswer::Conflict),
        }
    }

    pub fn register(
        &mut self,
        host: NvmetHost,
        rrega: u8,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
    ) -> NvmetAnswer {
        let result = match rrega {
            0 => match self.key_of(host) {
                Some(k) if k == nrkey => Ok(()),
                Some(_) => Err(NvmetAnswer::Conflict),
                None if nrkey == 0 => Err(NvmetAnswer::InvalidField),
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
            _ => Err(NvmetAnswer::InvalidField),
        };
        self.finish(result, true)
    }

    pub fn finish(&mut self, result: Result<(), NvmetAnswer>, bump: bool) -> NvmetAnswer {
        match result {
            Ok(()) => {
                if bump {
                    self.generation += 1;
                }
                NvmetAnswer::Ok
            }
            Err(a) => a,
        }
    }

    pub fn acquire(
        &mut self,
        host: NvmetHost,
        racqa: u8,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    ) -> NvmetAnswer {
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
                    Err(NvmetAnswer::Conflict)
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
                let victims: Vec<NvmetHost> = self
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
                    Err(NvmetAnswer::Conflict)
                } else {
                    for v in victims {
                        self.drop_registrant(v);
                    }
                    Ok(())
                };
                self.finish(result, true)
            }
            _ => NvmetAnswer::InvalidField,
        }
    }

    pub fn release(&mut self, host: NvmetHost, rrela: u8, rtype: u8, crkey: u64) -> NvmetAnswer {
        if let Err(a) = self.current(host, crkey, false) {
            return a;
        }
        match rrela {
            0 => {
                let result = if !self.holds(host) {
                    Ok(())
                } else if self.rtype != rtype {
                    Err(NvmetAnswer::Conflict)
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
            _ => NvmetAnswer::InvalidField,
        }
    }

    pub fn report(&self, format: ReportFormat) -> ReservationStatus {
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
pub enum NvmetFault {
    Errno(i32),
    Status(PrStatus),
    Nvme(NvmeStatus),
}

/// What the kernel on one host offers.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    /// Linux before ~6.19: no IOC_PR_READ_KEYS / IOC_PR_READ_RESERVATION.
    pub read_ioctls: bool,
    pub rescap: u8,
    /// The controller's Report format: nvmet answers only the extended one (EDS=1), a
    /// controller with 64-bit host ids only the original one.
    pub report: ReportFormat,
}

impl Kernel {
    /// Linux 6.19 and later against nvmet: the read ioctls, every reservation type, the
    /// extended Report.
    pub const CURRENT: Kernel = Kernel {
        read_ioctls: true,
        rescap: 0x7e,
        report: ReportFormat::Extended,
    };
}

/// One host's `/dev/nvme0n1` over the shared namespace.
pub struct Fake {
    pub ns: Arc<Mutex<Namespace>>,
    pub host: NvmetHost,
    pub path: PathBuf,
    pub kernel: Kernel,
    pub faults: Mutex<VecDeque<NvmetFault>>,
    /// Corrupts Report data (hostile controller).
    pub report_override: Mutex<Option<Vec<u8>>>,
}

impl Fake {
    /// Host `host`'s device `path` on namespace `ns`, with no faults queued.
    pub fn new(
        ns: Arc<Mutex<Namespace>>,
        host: NvmetHost,
        path: impl Into<PathBuf>,
        kernel: Kernel,
    ) -> Fake {
        Fake {
            ns,
            host,
            path: path.into(),
            kernel,
            faults: Mutex::new(VecDeque::new()),
            report_override: Mutex::new(None),
        }
    }

    pub fn fault(&self) -> Option<NvmetFault> {
        self.faults.lock().unwrap().pop_front()
    }

    fn block(
        &self,
        what: &'static str,
        op: impl FnOnce(&mut Namespace) -> NvmetAnswer,
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        match self.fault() {
            Some(NvmetFault::Errno(errno)) => return Err(self.errno(what, errno)),
            Some(NvmetFault::Status(status)) => return Ok(Err(status)),
            Some(NvmetFault::Nvme(_)) | None => {}
        }
        let mut ns = self.ns.lock().unwrap();
        ns.log.push((self.host, what.to_owned()));
        match op(&mut ns) {
            NvmetAnswer::Ok => Ok(Ok(())),
            NvmetAnswer::Conflict => Ok(Err(PrStatus::RESERVATION_CONFLICT)),
            // The kernel maps Invalid Field to -EINVAL.
            NvmetAnswer::InvalidField => Err(self.errno(what, nix::libc::EINVAL)),
        }
    }

    fn errno(&self, ioctl: &'static str, errno: i32) -> nvme_io::NvmeError {
        nvme_io::NvmeError::Ioctl {
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
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        let host = self.host;
        self.block("IOC_PR_REGISTER", |ns| {
            ns.register(host, if old != 0 { 2 } else { 0 }, ignore, old, new)
        })
    }
    fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
        let host = self.host;
        self.block("IOC_PR_RESERVE", |ns| {
            ns.acquire(host, 0, u8::try_from(rtype.code()).unwrap(), key, 0)
        })
    }
    fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
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
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
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
    fn pr_clear(&self, key: u64) -> Result<PrResult<()>, nvme_io::NvmeError> {
        let host = self.host;
        self.block("IOC_PR_CLEAR", |ns| ns.release(host, 1, 0, key))
    }
    fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, nvme_io::NvmeError> {
        if !self.kernel.read_ioctls {
            return Err(self.errno("IOC_PR_READ_KEYS", nix::libc::ENOTTY));
        }
        match self.fault() {
            Some(NvmetFault::Errno(errno)) => return Err(self.errno("IOC_PR_READ_KEYS", errno)),
            Some(NvmetFault::Status(status)) => return Ok(Err(status)),
            _ => {}
        }
        let mut ns = self.ns.lock().unwrap();
        // The kernel sends one Report.
        ns.log
            .push((self.host, "IOC_PR_READ_KEYS: Report".to_owned()));
        for (slot, (_, key)) in keys.iter_mut().zip(&ns.registrants) {
            *slot = *key;
        }
        Ok(Ok(PrKeys {
            generation: ns.generation,
            num_keys: u32::try_from(ns.registrants.len()).unwrap(),
        }))
    }
    fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, nvme_io::NvmeError> {
        if !self.kernel.read_ioctls {
            return Err(self.errno("IOC_PR_READ_RESERVATION", nix::libc::EOPNOTSUPP));
        }
        let mut ns = self.ns.lock().unwrap();
        // The kernel sends a Report for the registrant count, and a second for the data when
        // there are registrants (nvme_pr_read_reservation).
        ns.log.push((
            self.host,
            "IOC_PR_READ_RESERVATION: Report (count)".to_owned(),
        ));
        if !ns.registrants.is_empty() {
            ns.log
                .push((self.host, "IOC_PR_READ_RESERVATION: Report".to_owned()));
        }
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
    fn nsid(&self) -> Result<u32, nvme_io::NvmeError> {
        Ok(1)
    }
    fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        _timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        let done = |status| Ok(NvmeCompletion { status, result: 0 });
        match self.fault() {
            Some(NvmetFault::Errno(errno)) => return Err(self.errno("NVME_IOCTL_IO_CMD", errno)),
            Some(NvmetFault::Nvme(status)) => return done(status),
            Some(NvmetFault::Status(_)) | None => {}
        }
        assert_eq!(command.nsid, 1);
        let answer = |a| match a {
            NvmetAnswer::Ok => NvmeStatus::SUCCESS,
            NvmetAnswer::Conflict => NvmeStatus(0x4000 | NvmeStatus::RESERVATION_CONFLICT.0),
            NvmetAnswer::InvalidField => NvmeStatus::INVALID_FIELD,
        };
        let mut ns = self.ns.lock().unwrap();
        match (command.opcode, data) {
            (codec::RESERVATION_REGISTER, NvmeDataTransfer::ToDevice(d)) => {
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
            (codec::RESERVATION_REPORT, NvmeDataTransfer::FromDevice(buf)) => {
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
        data: NvmeDataTransfer<'_>,
        _timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        assert_eq!((command.opcode, command.cdw10), (codec::IDENTIFY, 0));
        let NvmeDataTransfer::FromDevice(buf) = data else {
            panic!("Identify reads");
        };
        buf[31] = self.kernel.rescap;
        Ok(NvmeCompletion {
            status: NvmeStatus::SUCCESS,
            result: 0,
        })
    }
}

impl Namespace {
    /// Whether `host` may write under the current reservation (NVMe's access rules, which match
    /// SPC's for the same types): anyone without a reservation, registrants under the
    /// registrants-only and all-registrants types, only the holder under Write Exclusive and
    /// Exclusive Access.
    pub fn may_write(&self, host: NvmetHost) -> bool {
        match self.rtype {
            0 => true,
            3..=6 => self.key_of(host).is_some(),
            _ => self.holds(host),
        }
    }
}
