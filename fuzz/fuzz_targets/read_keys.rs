//! ReadKeys::decode on hostile bytes: never panics, and what it accepts re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::{PrInAction, ReadKeys, next_allocation_length, required_length};

fuzz_target!(|data: &[u8]| {
    let action = PrInAction::ReadKeys;
    let _ = required_length(action, data);
    let _ = next_allocation_length(action, data.len(), data);
    if let Ok(value) = ReadKeys::decode(data) {
        assert_eq!(ReadKeys::decode(&value.encode()), Ok(value));
    }
});
