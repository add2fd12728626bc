//! The SG_IO ioctl itself: this crate's only unsafe code (`nvme-io`'s ioctls are the only other
//! in the workspace).
//!
//! `sg_io_hdr` (interface version 3, `'S'`) is defined here from `<scsi/sg.h>` rather than taken
//! from a bindings crate; a compile-time check pins its size and field offsets on 64-bit Linux.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

/// `SG_IO` from `<scsi/sg.h>`: write the command and wait for its completion in one call.
const SG_IO: libc::Ioctl = 0x2285;
const SG_INTERFACE_ID_ORIG: libc::c_int = b'S' as libc::c_int;
const SG_DXFER_NONE: libc::c_int = -1;
const SG_DXFER_TO_DEV: libc::c_int = -2;
const SG_DXFER_FROM_DEV: libc::c_int = -3;

/// `struct sg_io_hdr` from `<scsi/sg.h>`, field for field.
#[repr(C)]
struct SgIoHdr {
    interface_id: libc::c_int,
    dxfer_direction: libc::c_int,
    cmd_len: u8,
    mx_sb_len: u8,
    iovec_count: u16,
    dxfer_len: u32,
    dxferp: *mut libc::c_void,
    cmdp: *const u8,
    sbp: *mut u8,
    timeout: u32,
    flags: u32,
    pack_id: libc::c_int,
    usr_ptr: *mut libc::c_void,
    status: u8,
    masked_status: u8,
    msg_status: u8,
    sb_len_wr: u8,
    host_status: u16,
    driver_status: u16,
    resid: libc::c_int,
    duration: u32,
    info: u32,
}

// Layout of sg_io_hdr_t as compiled by gcc against <scsi/sg.h> on x86_64 (size 88, align 8).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<SgIoHdr>() == 88);
    assert!(align_of::<SgIoHdr>() == 8);
    assert!(std::mem::offset_of!(SgIoHdr, dxfer_len) == 12);
    assert!(std::mem::offset_of!(SgIoHdr, dxferp) == 16);
    assert!(std::mem::offset_of!(SgIoHdr, cmdp) == 24);
    assert!(std::mem::offset_of!(SgIoHdr, sbp) == 32);
    assert!(std::mem::offset_of!(SgIoHdr, timeout) == 40);
    assert!(std::mem::offset_of!(SgIoHdr, usr_ptr) == 56);
    assert!(std::mem::offset_of!(SgIoHdr, status) == 64);
    assert!(std::mem::offset_of!(SgIoHdr, sb_len_wr) == 67);
    assert!(std::mem::offset_of!(SgIoHdr, host_status) == 68);
    assert!(std::mem::offset_of!(SgIoHdr, driver_status) == 70);
    assert!(std::mem::offset_of!(SgIoHdr, resid) == 72);
    assert!(std::mem::offset_of!(SgIoHdr, duration) == 76);
    assert!(std::mem::offset_of!(SgIoHdr, info) == 80);
};

/// Where the data phase goes; lengths are already known to fit the header's `u32`.
pub(crate) enum Buffer<'a> {
    None,
    ToDevice(&'a [u8]),
    FromDevice(&'a mut [u8]),
}

/// What the kernel wrote back into the header.
pub(crate) struct Raw {
    pub status: u8,
    pub host_status: u16,
    pub driver_status: u16,
    pub sense_len: usize,
    pub resid: i32,
    pub duration_ms: u32,
}

/// Reasons a request cannot be expressed in an `sg_io_hdr`.
pub(crate) enum Unrepresentable {
    CdbLength(usize),
    DataLength(usize),
}

/// Runs one command synchronously. `sense` receives at most 255 bytes.
pub(crate) fn sg_io(
    fd: BorrowedFd<'_>,
    cdb: &[u8],
    buffer: Buffer<'_>,
    sense: &mut [u8],
    timeout_ms: u32,
) -> Result<io::Result<Raw>, Unrepresentable> {
    let cmd_len = u8::try_from(cdb.len()).map_err(|_| Unrepresentable::CdbLength(cdb.len()))?;
    let mx_sb_len = u8::try_from(sense.len()).unwrap_or(u8::MAX);
    let (dxfer_direction, dxferp, data_len) = match buffer {
        Buffer::None => (SG_DXFER_NONE, ptr::null_mut(), 0),
        Buffer::ToDevice([]) | Buffer::FromDevice([]) => (SG_DXFER_NONE, ptr::null_mut(), 0),
        // The kernel only reads a TO_DEV buffer; the header field is `void *` for both directions.
        Buffer::ToDevice(data) => (SG_DXFER_TO_DEV, data.as_ptr().cast_mut().cast(), data.len()),
        Buffer::FromDevice(data) => (SG_DXFER_FROM_DEV, data.as_mut_ptr().cast(), data.len()),
    };
    let dxfer_len = u32::try_from(data_len).map_err(|_| Unrepresentable::DataLength(data_len))?;
    let mut hdr = SgIoHdr {
        interface_id: SG_INTERFACE_ID_ORIG,
        dxfer_direction,
        cmd_len,
        mx_sb_len,
        iovec_count: 0,
        dxfer_len,
        dxferp,
        cmdp: cdb.as_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout_ms,
        // No SG_FLAG_DIRECT_IO: an sg node then copies through its own buffers, so a request
        // orphaned by a signal never writes into our memory after the ioctl has returned.
        flags: 0,
        pack_id: 0,
        usr_ptr: ptr::null_mut(),
        status: 0,
        masked_status: 0,
        msg_status: 0,
        sb_len_wr: 0,
        host_status: 0,
        driver_status: 0,
        resid: 0,
        duration: 0,
        info: 0,
    };
    // SAFETY: `hdr` is a properly laid out sg_io_hdr v3 (checked above) that lives across the call.
    // Every pointer in it is valid for the length stated next to it: `cmdp` for `cmd_len` bytes of
    // `cdb`, `sbp` for `mx_sb_len` <= `sense.len()` writable bytes, `dxferp` for `dxfer_len` bytes
    // (writable when FROM_DEV: it came from a `&mut [u8]`; only read when TO_DEV), or null with
    // length 0. All borrows outlive the call, and the kernel keeps no reference to them once it
    // returns: the block-device path (sd) waits for completion uninterruptibly, and the sg path
    // uses indirect I/O (flags 0), so an interrupted request only touches kernel buffers. The fd is
    // borrowed, so it stays open for the whole call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), SG_IO, ptr::from_mut(&mut hdr)) };
    if rc < 0 {
        return Ok(Err(io::Error::last_os_error()));
    }
    Ok(Ok(Raw {
        status: hdr.status,
        host_status: hdr.host_status,
        driver_status: hdr.driver_status,
        sense_len: usize::from(hdr.sb_len_wr).min(sense.len()),
        resid: hdr.resid,
        duration_ms: hdr.duration,
    }))
}
