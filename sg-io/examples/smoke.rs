//! In-lab smoke check: for each device given, TEST UNIT READY (repeated past unit attentions),
//! INQUIRY and PERSISTENT RESERVE IN / READ KEYS, printing each completion and its raw sense.
//! With `--write` (lab disks only: it overwrites block 0), also WRITE(10) of one 512-byte block of
//! zeros, to exercise the data-out direction. Exits non-zero if TEST UNIT READY or INQUIRY never
//! completes GOOD.
//!
//! Usage: smoke [--write] DEVICE...

use std::process::ExitCode;
use std::time::Duration;

use sg_io::{Access, Completion, DataTransfer, Device};

const TIMEOUT: Duration = Duration::from_secs(10);

fn show(what: &str, done: &Completion) {
    let sense = done
        .sense()
        .map_or_else(|| "no sense".to_owned(), |sense| sense.to_string());
    println!(
        "  {what}: good={} status={} host={} driver={} resid={} duration={:?} sense=[{}] {sense}",
        done.is_good(),
        done.status,
        done.host_status,
        done.driver_status,
        done.resid,
        done.duration,
        done.sense_hex(),
    );
}

fn check(path: &str, write: bool) -> Result<bool, sg_io::Error> {
    println!("{path}:");
    let device = Device::open(path, Access::ReadOnly)?;
    let mut ready = false;
    for _ in 0..4 {
        let done = device.execute(&[0; 6], DataTransfer::None, TIMEOUT)?;
        show("TEST UNIT READY", &done);
        if done.is_good() {
            ready = true;
            break;
        }
    }
    let mut inquiry = [0u8; 96];
    let done = device.execute(
        &[0x12, 0, 0, 0, 96, 0],
        DataTransfer::FromDevice(&mut inquiry),
        TIMEOUT,
    )?;
    show("INQUIRY", &done);
    let received = inquiry.len().saturating_sub(done.resid);
    println!(
        "  INQUIRY: {received} bytes, vendor {:?} product {:?}",
        String::from_utf8_lossy(&inquiry[8..16]).trim_end(),
        String::from_utf8_lossy(&inquiry[16..32]).trim_end(),
    );
    let inquiry_good = done.is_good();
    let mut keys = [0u8; 256];
    let done = device.execute(
        &[0x5e, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0],
        DataTransfer::FromDevice(&mut keys),
        TIMEOUT,
    )?;
    show("PR IN READ KEYS", &done);
    if done.is_good() {
        let length = u32::from_be_bytes([keys[4], keys[5], keys[6], keys[7]]);
        println!(
            "  PR IN READ KEYS: generation {} key bytes {length}",
            u32::from_be_bytes([keys[0], keys[1], keys[2], keys[3]])
        );
    }
    if write {
        let zeros = [0u8; 512];
        let device = Device::open(path, Access::ReadWrite)?;
        let done = device.execute(
            &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            DataTransfer::ToDevice(&zeros),
            TIMEOUT,
        )?;
        show("WRITE(10) LBA 0", &done);
    }
    Ok(ready && inquiry_good)
}

fn main() -> ExitCode {
    let mut ok = true;
    let mut write = false;
    for arg in std::env::args().skip(1) {
        if arg == "--write" {
            write = true;
            continue;
        }
        match check(&arg, write) {
            Ok(good) => ok &= good,
            Err(err) => {
                println!("  error: {err}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
