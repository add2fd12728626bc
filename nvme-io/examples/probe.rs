//! In-lab probe of the kernel interfaces the NVMe transport relies on, printing what each call
//! returned (raw values, no policy), for each namespace given:
//! NVME_IOCTL_ID, IOC_PR_READ_KEYS, IOC_PR_READ_RESERVATION, a passthrough Reservation Report
//! with EDS=1 and with EDS=0, and Identify Namespace's RESCAP byte.
//!
//! `--cycle` (lab namespaces only: it changes them) then runs, with key 0x4e56 and printing
//! READ KEYS / READ RESERVATION after each step: IOC_PR_REGISTER(0, key), IOC_PR_RESERVE with
//! Write Exclusive - All Registrants (what does READ RESERVATION report as key?), IOC_PR_RELEASE,
//! IOC_PR_RESERVE Write Exclusive - Registrants Only, IOC_PR_RELEASE, IOC_PR_REGISTER(key, key)
//! (replace with the same key: the probe the engine uses), a passthrough unregister (RREGA=1),
//! and IOC_PR_REGISTER(key, key, IGNORE) while unregistered (the engine expects a conflict).
//!
//! Run it as root and as a user without CAP_SYS_ADMIN to see what a read-only open is refused.
//!
//! Usage: probe [--cycle] DEVICE...

use std::process::ExitCode;
use std::time::Duration;

use nvme_io::{BlockDevice, NvmeCommand, NvmeDataTransfer, PrType};

const TIMEOUT: Duration = Duration::from_secs(10);
const KEY: u64 = 0x4e56;

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn reads(ns: &BlockDevice) {
    let mut keys = [0u64; 16];
    match ns.pr_read_keys(&mut keys) {
        Ok(Ok(read)) => {
            let shown = usize::try_from(read.num_keys).unwrap_or(0).min(keys.len());
            let listed: Vec<String> = keys[..shown].iter().map(|k| format!("{k:#x}")).collect();
            println!(
                "  IOC_PR_READ_KEYS: generation {} num_keys {} [{}]",
                read.generation,
                read.num_keys,
                listed.join(" ")
            );
        }
        Ok(Err(status)) => println!("  IOC_PR_READ_KEYS: {status}"),
        Err(e) => println!("  IOC_PR_READ_KEYS: {e}"),
    }
    match ns.pr_read_reservation() {
        Ok(Ok(r)) => println!(
            "  IOC_PR_READ_RESERVATION: key {:#x} generation {} type {} ({:?})",
            r.key,
            r.generation,
            r.rtype,
            r.pr_type()
        ),
        Ok(Err(status)) => println!("  IOC_PR_READ_RESERVATION: {status}"),
        Err(e) => println!("  IOC_PR_READ_RESERVATION: {e}"),
    }
}

fn report(ns: &BlockDevice, nsid: u32, eds: bool) {
    let mut buf = vec![0u8; 4096];
    let cmd = NvmeCommand {
        opcode: 0x0e,
        nsid,
        cdw10: 1023,
        cdw11: u32::from(eds),
        ..NvmeCommand::default()
    };
    match ns.io_passthru(&cmd, NvmeDataTransfer::FromDevice(&mut buf), TIMEOUT) {
        Ok(done) => {
            let (header, descriptor) = if eds { (64, 64) } else { (24, 24) };
            let regctl = usize::from(u16::from_le_bytes([buf[5], buf[6]]));
            println!(
                "  Report EDS={}: status {} result {:#x}; header {}",
                u8::from(eds),
                done.status,
                done.result,
                hex(&buf[..10])
            );
            for i in 0..regctl.min(8) {
                let at = header + i * descriptor;
                println!(
                    "    registrant {i}: {}",
                    hex(&buf[at..at + descriptor.min(32)])
                );
            }
        }
        Err(e) => println!("  Report EDS={}: {e}", u8::from(eds)),
    }
}

fn identify(ns: &BlockDevice, nsid: u32) {
    let mut buf = vec![0u8; 4096];
    let cmd = NvmeCommand {
        opcode: 0x06,
        nsid,
        ..NvmeCommand::default()
    };
    match ns.admin_passthru(&cmd, NvmeDataTransfer::FromDevice(&mut buf), TIMEOUT) {
        Ok(done) => println!(
            "  Identify Namespace: status {}; RESCAP {:#04x}",
            done.status, buf[31]
        ),
        Err(e) => println!("  Identify Namespace: {e}"),
    }
}

fn step<T: std::fmt::Debug>(ns: &BlockDevice, what: &str, result: Result<T, nvme_io::NvmeError>) {
    match result {
        Ok(outcome) => println!("  {what}: {outcome:?}"),
        Err(e) => println!("  {what}: {e}"),
    }
    reads(ns);
}

fn cycle(ns: &BlockDevice, nsid: u32) {
    step(ns, "register(0, key)", ns.pr_register(0, KEY, false));
    for rtype in [PrType::WriteExclusiveAllRegs, PrType::WriteExclusiveRegOnly] {
        step(ns, &format!("reserve {rtype:?}"), ns.pr_reserve(KEY, rtype));
        report(ns, nsid, true);
        step(ns, &format!("release {rtype:?}"), ns.pr_release(KEY, rtype));
    }
    step(
        ns,
        "register(key, key) (probe)",
        ns.pr_register(KEY, KEY, false),
    );
    let mut data = [0u8; 16];
    data[..8].copy_from_slice(&KEY.to_le_bytes());
    let unregister = NvmeCommand {
        opcode: 0x0d,
        nsid,
        cdw10: 1,
        ..NvmeCommand::default()
    };
    step(
        ns,
        "passthrough unregister (RREGA=1)",
        ns.io_passthru(&unregister, NvmeDataTransfer::ToDevice(&data), TIMEOUT),
    );
    step(
        ns,
        "register(key, key, IGNORE) while unregistered",
        ns.pr_register(KEY, KEY, true),
    );
    step(
        ns,
        "cleanup: passthrough unregister with IEKEY",
        ns.io_passthru(
            &NvmeCommand {
                cdw10: 1 | 1 << 3,
                ..unregister
            },
            NvmeDataTransfer::ToDevice(&data),
            TIMEOUT,
        ),
    );
}

fn main() -> ExitCode {
    let mut do_cycle = false;
    let mut failed = false;
    for arg in std::env::args().skip(1) {
        if arg == "--cycle" {
            do_cycle = true;
            continue;
        }
        println!("{arg}:");
        let ns = match BlockDevice::open(&arg) {
            Ok(ns) => ns,
            Err(e) => {
                println!("  {e}");
                failed = true;
                continue;
            }
        };
        let nsid = match ns.nsid() {
            Ok(nsid) => {
                println!("  NVME_IOCTL_ID: {nsid}");
                nsid
            }
            Err(e) => {
                println!("  {e}");
                failed = true;
                continue;
            }
        };
        reads(&ns);
        report(&ns, nsid, true);
        report(&ns, nsid, false);
        identify(&ns, nsid);
        if do_cycle {
            cycle(&ns, nsid);
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
