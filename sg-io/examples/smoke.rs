//! In-lab smoke check: for each device given, TEST UNIT READY (repeated past unit attentions),
//! INQUIRY and PERSISTENT RESERVE IN / READ KEYS, printing each completion and its raw sense.
//! Exits non-zero if TEST UNIT READY or INQUIRY never completes GOOD.
//!
//! Options (lab disks only: they change the device), applying to the devices after them:
//! - `--write`: WRITE(10) of one 512-byte block of zeros at LBA 0 (data-out, read-write fd).
//! - `--pr-register`: PR OUT REGISTER AND IGNORE EXISTING KEY 0x5347, READ KEYS, then unregister,
//!   all through a read-only fd (works for root: CAP_SYS_RAWIO).
//! - `--tur-timeout-ms N`: a single TEST UNIT READY with that timeout, instead of the ready loop.
//!
//! Usage: smoke [OPTIONS] DEVICE...

use std::process::ExitCode;
use std::time::Duration;

use sg_io::{Completion, DataTransfer, Device, OpenMode};

const TIMEOUT: Duration = Duration::from_secs(10);
const SMOKE_KEY: u64 = 0x5347;

#[derive(Default)]
struct Options {
    write: bool,
    pr_register: bool,
    tur_timeout: Option<Duration>,
}

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

fn read_keys(device: &Device) -> Result<Completion, sg_io::Error> {
    let mut keys = [0u8; 256];
    let done = device.execute(
        &[0x5e, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0],
        DataTransfer::FromDevice(&mut keys),
        TIMEOUT,
    )?;
    show("PR IN READ KEYS", &done);
    if done.is_good() {
        let length = u32::from_be_bytes([keys[4], keys[5], keys[6], keys[7]]);
        let listed = usize::try_from(length).unwrap_or(0).min(keys.len() - 8);
        let registered: Vec<String> = keys[8..8 + listed]
            .chunks_exact(8)
            .map(|key| {
                format!(
                    "{:#x}",
                    u64::from_be_bytes(key.try_into().unwrap_or([0; 8]))
                )
            })
            .collect();
        println!(
            "  PR IN READ KEYS: generation {} keys {registered:?}",
            u32::from_be_bytes([keys[0], keys[1], keys[2], keys[3]])
        );
    }
    Ok(done)
}

fn register_and_ignore(device: &Device, key: u64) -> Result<Completion, sg_io::Error> {
    let mut parameters = [0u8; 24];
    parameters[8..16].copy_from_slice(&key.to_be_bytes());
    let done = device.execute(
        &[0x5f, 0x06, 0, 0, 0, 0, 0, 0, 24, 0],
        DataTransfer::ToDevice(&parameters),
        TIMEOUT,
    )?;
    show(&format!("PR OUT REGISTER AND IGNORE {key:#x}"), &done);
    Ok(done)
}

fn check(path: &str, options: &Options) -> Result<bool, sg_io::Error> {
    println!("{path}:");
    let device = Device::open(path, OpenMode::ReadOnly)?;
    let mut ready = false;
    let attempts = if options.tur_timeout.is_some() { 1 } else { 4 };
    for _ in 0..attempts {
        let timeout = options.tur_timeout.unwrap_or(TIMEOUT);
        let done = device.execute(&[0; 6], DataTransfer::None, timeout)?;
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
    read_keys(&device)?;
    if options.pr_register {
        register_and_ignore(&device, SMOKE_KEY)?;
        read_keys(&device)?;
        register_and_ignore(&device, 0)?;
    }
    if options.write {
        let zeros = [0u8; 512];
        let device = Device::open(path, OpenMode::ReadWrite)?;
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
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--write" => options.write = true,
            "--pr-register" => options.pr_register = true,
            "--tur-timeout-ms" => {
                let Some(millis) = args.next().and_then(|n| n.parse().ok()) else {
                    eprintln!("--tur-timeout-ms needs a number of milliseconds");
                    return ExitCode::FAILURE;
                };
                options.tur_timeout = Some(Duration::from_millis(millis));
            }
            path => match check(path, &options) {
                Ok(good) => ok &= good,
                Err(err) => {
                    println!("  error: {err}");
                    ok = false;
                }
            },
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
