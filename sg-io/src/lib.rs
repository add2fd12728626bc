//! SG_IO: send a SCSI command to a Linux block or sg device and get back a typed completion.
//!
//! This crate knows nothing about persistent reservations; it is the workspace's only unsafe code.
