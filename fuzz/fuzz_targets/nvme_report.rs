//! The NVMe extended Reservation Report and Identify RESCAP decoders on hostile bytes: never
//! panic, and what they accept re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::nvme::{ReservationCapabilities, ReservationStatus, required_report_length};

fuzz_target!(|data: &[u8]| {
    let _ = required_report_length(data);
    if let Ok(value) = ReservationStatus::decode(data) {
        assert_eq!(ReservationStatus::decode(&value.encode()), Ok(value));
    }
    if let Ok(caps) = ReservationCapabilities::decode_identify(data) {
        assert_eq!(ReservationCapabilities::from_rescap(caps.rescap()), caps);
    }
});
