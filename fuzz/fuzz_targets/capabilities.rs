//! Capabilities::decode on hostile bytes: never panics, and what it accepts re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::{Capabilities, PrInAction, next_allocation_length, required_length};

fuzz_target!(|data: &[u8]| {
    let action = PrInAction::ReportCapabilities;
    let _ = required_length(action, data);
    let _ = next_allocation_length(action, data.len(), data);
    if let Ok(value) = Capabilities::decode(data) {
        assert_eq!(Capabilities::decode(&value.encode()), Ok(value));
    }
});
