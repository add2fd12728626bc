//! ReadReservation::decode on hostile bytes: never panics, and what it accepts re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::{PrInAction, ReadReservation, next_allocation_length, required_length};

fuzz_target!(|data: &[u8]| {
    let action = PrInAction::ReadReservation;
    let _ = required_length(action, data);
    let _ = next_allocation_length(action, data.len(), data);
    if let Ok(value) = ReadReservation::decode(data) {
        assert_eq!(ReadReservation::decode(&value.encode()), Ok(value));
    }
});
