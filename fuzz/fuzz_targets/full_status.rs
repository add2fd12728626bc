//! FullStatus::decode on hostile bytes: never panics, and what it accepts re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::{FullStatus, PrInAction, next_allocation_length, required_length};

fuzz_target!(|data: &[u8]| {
    let action = PrInAction::ReadFullStatus;
    let _ = required_length(action, data);
    let _ = next_allocation_length(action, data.len(), data);
    if let Ok(value) = FullStatus::decode(data) {
        assert_eq!(FullStatus::decode(&value.encode()), Ok(value));
    }
});
