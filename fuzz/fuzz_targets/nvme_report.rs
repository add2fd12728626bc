//! The NVMe extended Reservation Report and Identify RESCAP decoders on hostile bytes: never
//! panic, and what they accept re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::nvme::{
    ReportFormat, ReservationCapabilities, ReservationStatus, required_report_length,
};

fuzz_target!(|data: &[u8]| {
    let _ = required_report_length(data);
    for format in [ReportFormat::Extended, ReportFormat::Basic] {
        if let Ok(value) = ReservationStatus::decode_as(format, data) {
            assert_eq!(ReservationStatus::decode_as(format, &value.encode()), Ok(value));
        }
    }
    if let Ok(caps) = ReservationCapabilities::decode_identify(data) {
        assert_eq!(ReservationCapabilities::from_rescap(caps.rescap()), caps);
    }
});
