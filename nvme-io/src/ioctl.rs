//! The ioctls themselves: this crate's only unsafe code.
//!
//! The argument structs are written here from `<linux/pr.h>` and `<linux/nvme_ioctl.h>` (Linux
//! 7.2) rather than taken from a bindings crate; compile-time checks pin their sizes and field
//! offsets, and the ioctl numbers are computed with the kernel's `_IOC` formula and pinned to
//! their literal values.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

/// `_IOC(dir, type, nr, size)` from `<asm-generic/ioctl.h>` (x86, arm64, riscv; not the
/// alpha/mips/powerpc/sparc layouts, which this crate does not build for).
#[allow(clippy::cast_possible_truncation)] // `size` is checked below to fit its 14 bits.
const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> libc::Ioctl {
    assert!(size < (1 << 14));
    let value = (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32;
    value as libc::Ioctl
}
const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

#[cfg(not(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "arm"
)))]
compile_error!(
    "nvme-io computes ioctl numbers with the asm-generic layout; check this architecture's"
);

/// `struct pr_registration`.
#[repr(C)]
pub(crate) struct PrRegistration {
    pub old_key: u64,
    pub new_key: u64,
    pub flags: u32,
    pub pad: u32,
}

/// `struct pr_reservation` (RESERVE and RELEASE).
#[repr(C)]
pub(crate) struct PrReservationArg {
    pub key: u64,
    pub rtype: u32,
    pub flags: u32,
}

/// `struct pr_preempt`.
#[repr(C)]
pub(crate) struct PrPreempt {
    pub old_key: u64,
    pub new_key: u64,
    pub rtype: u32,
    pub flags: u32,
}

/// `struct pr_clear`.
#[repr(C)]
pub(crate) struct PrClear {
    pub key: u64,
    pub flags: u32,
    pub pad: u32,
}

/// `struct pr_read_keys`.
#[repr(C)]
struct PrReadKeys {
    generation: u32,
    num_keys: u32,
    keys_ptr: u64,
}

/// `struct pr_read_reservation`.
#[repr(C)]
struct PrReadReservation {
    key: u64,
    generation: u32,
    rtype: u32,
}

/// `struct nvme_passthru_cmd`.
#[repr(C)]
struct NvmePassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

// Layouts as gcc lays out the kernel headers' structs (no padding anywhere: every field is
// naturally aligned).
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<PrRegistration>() == 24);
    assert!(offset_of!(PrRegistration, new_key) == 8);
    assert!(offset_of!(PrRegistration, flags) == 16);
    assert!(size_of::<PrReservationArg>() == 16);
    assert!(offset_of!(PrReservationArg, rtype) == 8);
    assert!(offset_of!(PrReservationArg, flags) == 12);
    assert!(size_of::<PrPreempt>() == 24);
    assert!(offset_of!(PrPreempt, new_key) == 8);
    assert!(offset_of!(PrPreempt, rtype) == 16);
    assert!(offset_of!(PrPreempt, flags) == 20);
    assert!(size_of::<PrClear>() == 16);
    assert!(offset_of!(PrClear, flags) == 8);
    assert!(size_of::<PrReadKeys>() == 16);
    assert!(offset_of!(PrReadKeys, num_keys) == 4);
    assert!(offset_of!(PrReadKeys, keys_ptr) == 8);
    assert!(size_of::<PrReadReservation>() == 16);
    assert!(offset_of!(PrReadReservation, generation) == 8);
    assert!(offset_of!(PrReadReservation, rtype) == 12);
    assert!(size_of::<NvmePassthruCmd>() == 72);
    assert!(align_of::<NvmePassthruCmd>() == 8);
    assert!(offset_of!(NvmePassthruCmd, nsid) == 4);
    assert!(offset_of!(NvmePassthruCmd, cdw2) == 8);
    assert!(offset_of!(NvmePassthruCmd, metadata) == 16);
    assert!(offset_of!(NvmePassthruCmd, addr) == 24);
    assert!(offset_of!(NvmePassthruCmd, metadata_len) == 32);
    assert!(offset_of!(NvmePassthruCmd, data_len) == 36);
    assert!(offset_of!(NvmePassthruCmd, cdw10) == 40);
    assert!(offset_of!(NvmePassthruCmd, cdw15) == 60);
    assert!(offset_of!(NvmePassthruCmd, timeout_ms) == 64);
    assert!(offset_of!(NvmePassthruCmd, result) == 68);
};

pub(crate) const IOC_PR_REGISTER: libc::Ioctl =
    ioc(IOC_WRITE, b'p', 200, size_of::<PrRegistration>());
pub(crate) const IOC_PR_RESERVE: libc::Ioctl =
    ioc(IOC_WRITE, b'p', 201, size_of::<PrReservationArg>());
pub(crate) const IOC_PR_RELEASE: libc::Ioctl =
    ioc(IOC_WRITE, b'p', 202, size_of::<PrReservationArg>());
pub(crate) const IOC_PR_PREEMPT: libc::Ioctl = ioc(IOC_WRITE, b'p', 203, size_of::<PrPreempt>());
pub(crate) const IOC_PR_PREEMPT_ABORT: libc::Ioctl =
    ioc(IOC_WRITE, b'p', 204, size_of::<PrPreempt>());
pub(crate) const IOC_PR_CLEAR: libc::Ioctl = ioc(IOC_WRITE, b'p', 205, size_of::<PrClear>());
pub(crate) const IOC_PR_READ_KEYS: libc::Ioctl =
    ioc(IOC_READ | IOC_WRITE, b'p', 206, size_of::<PrReadKeys>());
pub(crate) const IOC_PR_READ_RESERVATION: libc::Ioctl =
    ioc(IOC_READ, b'p', 207, size_of::<PrReadReservation>());
pub(crate) const NVME_IOCTL_ID: libc::Ioctl = ioc(IOC_NONE, b'N', 0x40, 0);
pub(crate) const NVME_IOCTL_ADMIN_CMD: libc::Ioctl = ioc(
    IOC_READ | IOC_WRITE,
    b'N',
    0x41,
    size_of::<NvmePassthruCmd>(),
);
pub(crate) const NVME_IOCTL_IO_CMD: libc::Ioctl = ioc(
    IOC_READ | IOC_WRITE,
    b'N',
    0x43,
    size_of::<NvmePassthruCmd>(),
);

/// `PR_FL_IGNORE_KEY`.
pub(crate) const PR_FL_IGNORE_KEY: u32 = 1;

/// `enum pr_type`: the block layer's reservation types, numbered like NVMe's RTYPE (not like
/// SCSI's TYPE codes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegOnly = 3,
    ExclusiveAccessRegOnly = 4,
    WriteExclusiveAllRegs = 5,
    ExclusiveAccessAllRegs = 6,
}

impl PrType {
    pub const ALL: [PrType; 6] = [
        PrType::WriteExclusive,
        PrType::ExclusiveAccess,
        PrType::WriteExclusiveRegOnly,
        PrType::ExclusiveAccessRegOnly,
        PrType::WriteExclusiveAllRegs,
        PrType::ExclusiveAccessAllRegs,
    ];

    pub fn code(self) -> u32 {
        self as u32
    }

    /// The type for a `pr_type` value; `None` for 0 (no reservation) and unknown values.
    pub fn from_code(code: u32) -> Option<PrType> {
        PrType::ALL.into_iter().find(|t| t.code() == code)
    }
}

/// A block PR ioctl whose argument the kernel only reads (`copy_from_user` of the whole struct).
pub(crate) trait PrOutArg {
    /// The ioctl number; its size field equals `size_of::<Self>()` (asserted in the tests).
    const REQUEST: libc::Ioctl;
    const NAME: &'static str;
}

impl PrOutArg for PrRegistration {
    const REQUEST: libc::Ioctl = IOC_PR_REGISTER;
    const NAME: &'static str = "IOC_PR_REGISTER";
}
impl PrOutArg for PrClear {
    const REQUEST: libc::Ioctl = IOC_PR_CLEAR;
    const NAME: &'static str = "IOC_PR_CLEAR";
}

/// RESERVE and RELEASE share their argument struct; the wrapper says which.
pub(crate) struct Reserve(pub PrReservationArg);
pub(crate) struct Release(pub PrReservationArg);
pub(crate) struct Preempt(pub PrPreempt);
pub(crate) struct PreemptAbort(pub PrPreempt);

impl PrOutArg for Reserve {
    const REQUEST: libc::Ioctl = IOC_PR_RESERVE;
    const NAME: &'static str = "IOC_PR_RESERVE";
}
impl PrOutArg for Release {
    const REQUEST: libc::Ioctl = IOC_PR_RELEASE;
    const NAME: &'static str = "IOC_PR_RELEASE";
}
impl PrOutArg for Preempt {
    const REQUEST: libc::Ioctl = IOC_PR_PREEMPT;
    const NAME: &'static str = "IOC_PR_PREEMPT";
}
impl PrOutArg for PreemptAbort {
    const REQUEST: libc::Ioctl = IOC_PR_PREEMPT_ABORT;
    const NAME: &'static str = "IOC_PR_PREEMPT_ABORT";
}

/// The struct each PR OUT ioctl reads.
pub(crate) trait PrOutStruct {
    type Raw;
    fn raw(&self) -> &Self::Raw;
}
impl PrOutStruct for PrRegistration {
    type Raw = PrRegistration;
    fn raw(&self) -> &PrRegistration {
        self
    }
}
impl PrOutStruct for PrClear {
    type Raw = PrClear;
    fn raw(&self) -> &PrClear {
        self
    }
}
impl PrOutStruct for Reserve {
    type Raw = PrReservationArg;
    fn raw(&self) -> &PrReservationArg {
        &self.0
    }
}
impl PrOutStruct for Release {
    type Raw = PrReservationArg;
    fn raw(&self) -> &PrReservationArg {
        &self.0
    }
}
impl PrOutStruct for Preempt {
    type Raw = PrPreempt;
    fn raw(&self) -> &PrPreempt {
        &self.0
    }
}
impl PrOutStruct for PreemptAbort {
    type Raw = PrPreempt;
    fn raw(&self) -> &PrPreempt {
        &self.0
    }
}

/// The ioctl's return value when it is not -1: 0 or a positive `pr_status`. A negative value
/// other than -1 does not occur; it is reported as an error rather than trusted.
fn status(rc: libc::c_int) -> io::Result<u32> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc.unsigned_abs())
}

/// Runs one of the PR OUT ioctls (register, reserve, release, preempt, preempt-abort, clear).
/// Returns 0 or the device's `pr_status`.
pub(crate) fn pr_out<A: PrOutArg + PrOutStruct>(fd: BorrowedFd<'_>, arg: &A) -> io::Result<u32> {
    let raw: *const A::Raw = arg.raw();
    // SAFETY: `A::REQUEST` is one of the IOC_PR_* write ioctls, each paired (by the impls above)
    // with the #[repr(C)] struct it is declared with in <linux/pr.h>; the sizes are pinned by the
    // layout asserts and by `request_sizes_match_their_structs`. The kernel only copies that many
    // bytes from `raw` (copy_from_user) and writes nothing back; `raw` points to a live struct
    // borrowed for the whole call, and the fd is borrowed, so it stays open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), A::REQUEST, raw) };
    status(rc)
}

/// What IOC_PR_READ_KEYS wrote back.
pub(crate) struct ReadKeysOut {
    pub status: u32,
    pub generation: u32,
    pub num_keys: u32,
}

/// IOC_PR_READ_KEYS into `keys` (at most [`crate::PR_KEYS_MAX`] entries; the caller checks).
pub(crate) fn pr_read_keys(fd: BorrowedFd<'_>, keys: &mut [u64]) -> io::Result<ReadKeysOut> {
    let capacity = u32::try_from(keys.len()).unwrap_or(u32::MAX);
    let mut arg = PrReadKeys {
        generation: 0,
        num_keys: capacity,
        keys_ptr: keys.as_mut_ptr() as u64,
    };
    // SAFETY: `arg` is a #[repr(C)] pr_read_keys (layout asserted) alive across the call; the
    // kernel reads it, writes at most `num_keys` = `keys.len()` u64 values to `keys_ptr` (a
    // writable, exclusively borrowed, properly aligned slice of exactly that many u64) with
    // copy_to_user, then writes `generation` and `num_keys` back into `arg`. It keeps no pointer
    // after returning; the fd is borrowed, so it stays open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_PR_READ_KEYS, ptr::from_mut(&mut arg)) };
    Ok(ReadKeysOut {
        status: status(rc)?,
        generation: arg.generation,
        num_keys: arg.num_keys,
    })
}

/// What IOC_PR_READ_RESERVATION wrote back.
pub(crate) struct ReadReservationOut {
    pub status: u32,
    pub key: u64,
    pub generation: u32,
    pub rtype: u32,
}

pub(crate) fn pr_read_reservation(fd: BorrowedFd<'_>) -> io::Result<ReadReservationOut> {
    let mut arg = PrReadReservation {
        key: 0,
        generation: 0,
        rtype: 0,
    };
    // SAFETY: `arg` is a #[repr(C)] pr_read_reservation (layout asserted), exclusively borrowed
    // and alive across the call; the kernel writes exactly that struct back with copy_to_user
    // and holds no pointer afterwards. The fd is borrowed, so it stays open.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            IOC_PR_READ_RESERVATION,
            ptr::from_mut(&mut arg),
        )
    };
    Ok(ReadReservationOut {
        status: status(rc)?,
        key: arg.key,
        generation: arg.generation,
        rtype: arg.rtype,
    })
}

/// NVME_IOCTL_ID: the namespace id of the block device (the return value).
pub(crate) fn nvme_nsid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument and touches no user memory; it returns the nsid or
    // -1 with errno. The fd is borrowed, so it stays open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), NVME_IOCTL_ID) };
    status(rc)
}

/// Which passthrough queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Queue {
    Admin,
    Io,
}

/// A passthrough command ready for the kernel. `data` is the user buffer: the caller
/// ([`crate::BlockDevice::passthru`]) has checked that the opcode's data direction matches
/// the borrow (the kernel writes only into a buffer of an opcode whose bit 0 is clear).
pub(crate) struct Passthru<'a> {
    pub opcode: u8,
    pub nsid: u32,
    pub cdw: [u32; 6],
    pub timeout_ms: u32,
    pub data: Data<'a>,
}

pub(crate) enum Data<'a> {
    None,
    /// Only read by the kernel: the opcode's bit 0 (host to controller) is set.
    ToDevice(&'a [u8]),
    /// Written by the kernel: the opcode's bit 0 is clear.
    FromDevice(&'a mut [u8]),
}

/// What the passthrough ioctl returned: 0 or the NVMe status field, and the completion's DW0.
pub(crate) struct PassthruOut {
    pub status: u32,
    pub result: u32,
}

pub(crate) fn nvme_passthru(
    fd: BorrowedFd<'_>,
    queue: Queue,
    command: Passthru<'_>,
) -> io::Result<PassthruOut> {
    let (addr, len) = match command.data {
        Data::None => (0, 0),
        Data::ToDevice(buf) => (buf.as_ptr() as u64, buf.len()),
        Data::FromDevice(buf) => (buf.as_mut_ptr() as u64, buf.len()),
    };
    let data_len = u32::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let [cdw10, cdw11, cdw12, cdw13, cdw14, cdw15] = command.cdw;
    let mut cmd = NvmePassthruCmd {
        opcode: command.opcode,
        flags: 0,
        rsvd1: 0,
        nsid: command.nsid,
        cdw2: 0,
        cdw3: 0,
        metadata: 0,
        addr,
        metadata_len: 0,
        data_len,
        cdw10,
        cdw11,
        cdw12,
        cdw13,
        cdw14,
        cdw15,
        timeout_ms: command.timeout_ms,
        result: 0,
    };
    let request = match queue {
        Queue::Admin => NVME_IOCTL_ADMIN_CMD,
        Queue::Io => NVME_IOCTL_IO_CMD,
    };
    // SAFETY: `cmd` is a #[repr(C)] nvme_passthru_cmd (layout asserted), exclusively borrowed
    // and alive across the call; the kernel reads it and writes `result` back. `addr` is 0 with
    // length 0, or points to a buffer borrowed for the whole call of exactly `data_len` bytes:
    // writable (from `&mut [u8]`) when the opcode transfers controller-to-host, and only read by
    // the kernel otherwise (it maps the buffer for a write exactly when opcode bit 0 is set,
    // which `BlockDevice::passthru` checks before building a `ToDevice`). No metadata buffer is
    // given. The ioctl waits for the command's completion (or its cancellation) before
    // returning, and the kernel unmaps the user pages before it returns, so nothing refers to the
    // buffers afterwards. The fd is borrowed, so it stays open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, ptr::from_mut(&mut cmd)) };
    Ok(PassthruOut {
        status: status(rc)?,
        result: cmd.result,
    })
}

#[cfg(test)]
// `libc::Ioctl` is `c_ulong` on glibc and `c_int` on musl: the casts are needed on one of them.
#[allow(clippy::unnecessary_cast)]
mod tests {
    use super::*;

    fn size_field(request: libc::Ioctl) -> usize {
        usize::try_from((request as u64 >> 16) & 0x3fff).unwrap()
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Worked out by hand from _IOC(dir, type, nr, size) = dir<<30 | size<<16 | type<<8 | nr.
        let expected: [(libc::Ioctl, u32); 11] = [
            (IOC_PR_REGISTER, 0x4018_70c8),
            (IOC_PR_RESERVE, 0x4010_70c9),
            (IOC_PR_RELEASE, 0x4010_70ca),
            (IOC_PR_PREEMPT, 0x4018_70cb),
            (IOC_PR_PREEMPT_ABORT, 0x4018_70cc),
            (IOC_PR_CLEAR, 0x4010_70cd),
            (IOC_PR_READ_KEYS, 0xc010_70ce),
            (IOC_PR_READ_RESERVATION, 0x8010_70cf),
            (NVME_IOCTL_ID, 0x0000_4e40),
            (NVME_IOCTL_ADMIN_CMD, 0xc048_4e41),
            (NVME_IOCTL_IO_CMD, 0xc048_4e43),
        ];
        for (actual, literal) in expected {
            assert_eq!(
                actual as u64,
                u64::from(literal),
                "{actual:#x} != {literal:#x}"
            );
        }
    }

    #[test]
    fn request_sizes_match_their_structs() {
        fn check<A: PrOutArg + PrOutStruct>() {
            assert_eq!(size_field(A::REQUEST), size_of::<A::Raw>(), "{}", A::NAME);
        }
        check::<PrRegistration>();
        check::<PrClear>();
        check::<Reserve>();
        check::<Release>();
        check::<Preempt>();
        check::<PreemptAbort>();
    }

    #[test]
    fn pr_types_are_the_kernels_numbers() {
        assert_eq!(PrType::WriteExclusive.code(), 1);
        assert_eq!(PrType::ExclusiveAccessAllRegs.code(), 6);
        assert_eq!(PrType::from_code(0), None);
        assert_eq!(PrType::from_code(7), None);
        for t in PrType::ALL {
            assert_eq!(PrType::from_code(t.code()), Some(t));
        }
    }
}
