//! The path probe: is this nexus registered with our key? Used by heal and by the agent's path
//! audit, so both answer the question the same way.

use crate::pr::{Key, PrOut, PrOutAction};
use crate::transport::{Command, CommandError, ErrorKind, PrTransport};

/// Whether `path`'s nexus is registered with `key`, without changing anything but PRgeneration:
/// REGISTER with RESERVATION KEY = SERVICE ACTION RESERVATION KEY = `key` succeeds only on a nexus
/// registered with `key` (re-registering the same key), and is answered with RESERVATION
/// CONFLICT by any other nexus (SPC-4 5.14.7.2: an unregistered nexus with a non-zero
/// reservation key, or a nexus registered with another key). It never creates a registration,
/// so it cannot bring back a preempted key (P3). LIO refuses a key change of a registration made
/// with ALL_TG_PT unless the request sets it too (INVALID FIELD IN CDB); then it is asked again
/// with ALL_TG_PT, which on a nexus without such a registration is refused the same way.
///
/// Why not READ FULL STATUS: it lists each registration's TransportID (iSCSI name + ISID) and
/// relative target port, but Linux does not tell which ISID a session uses, and after a re-login
/// the stale registration has the same initiator name and port as the new, unregistered nexus.
pub fn probe_registration<T: PrTransport + ?Sized>(
    path: &T,
    key: Key,
) -> Result<bool, CommandError> {
    let answer = |r: Result<_, CommandError>| match r {
        Ok(_) => Ok(Some(true)),
        Err(e) if e.kind == ErrorKind::ReservationConflict => Ok(Some(false)),
        Err(e) if e.kind == ErrorKind::InvalidField => Ok(None),
        Err(e) => Err(e),
    };
    let restate = PrOut::register(key, key);
    if let Some(registered) = answer(path.pr_out(&restate))? {
        return Ok(registered);
    }
    answer(path.pr_out(&restate.with_all_tg_pt(true)))?.ok_or_else(|| {
        CommandError::without_completion(
            path.device(),
            Command::PrOut(PrOutAction::Register),
            ErrorKind::InvalidField,
            "re-registering our own key was refused with and without ALL_TG_PT",
        )
    })
}

#[cfg(test)]
mod tests {
    //! The probe on the SPC model with LIO's quirks (an ALL_TG_PT registration refuses a plain
    //! REGISTER) and without them.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::exec::ScsiPr;
    use crate::pr::TransportId;
    use crate::spc_model::{ModelDevice, ModelLu, Nexus, Quirks};
    use crate::transport::Policy;

    const A: Key = Key::new(0xa);
    const B: Key = Key::new(0xb);

    fn connect(lu: &mut ModelLu, isid: &str) -> Nexus {
        lu.connect(
            TransportId::Iscsi {
                name: "iqn.2026-11.lab:nodea".to_string(),
                isid: Some(isid.to_string()),
            },
            1,
        )
    }

    fn path(lu: &Arc<Mutex<ModelLu>>, nexus: Nexus) -> ScsiPr<ModelDevice> {
        ScsiPr::new(
            ModelDevice::new(Arc::clone(lu), nexus, "/dev/sdx"),
            Policy {
                not_ready_backoff: Duration::from_millis(1),
                ..Policy::default()
            },
        )
    }

    /// A nexus registered plainly, one never registered, one registered with ALL_TG_PT.
    fn setup(quirks: Quirks) -> (Arc<Mutex<ModelLu>>, [Nexus; 3]) {
        let mut lu = ModelLu::new(quirks);
        let plain = connect(&mut lu, "0x1");
        let orphan = connect(&mut lu, "0x2");
        let all_ports = connect(&mut lu, "0x3");
        lu.pr_out(plain, &PrOut::register_ignore(A)).unwrap();
        lu.pr_out(all_ports, &PrOut::register_ignore(A).with_all_tg_pt(true))
            .unwrap();
        (Arc::new(Mutex::new(lu)), [plain, orphan, all_ports])
    }

    fn state(lu: &Arc<Mutex<ModelLu>>) -> (u32, Vec<crate::spc_model::Registered>) {
        let lu = lu.lock().unwrap();
        (lu.generation(), lu.registrations().to_vec())
    }

    #[test]
    fn tells_registered_from_unregistered_nexuses_and_registers_nothing() {
        for quirks in [Quirks::lio(), Quirks::spc4()] {
            let (lu, [plain, orphan, all_ports]) = setup(quirks);
            let (_, before) = state(&lu);
            assert!(probe_registration(&path(&lu, plain), A).unwrap());
            assert!(!probe_registration(&path(&lu, orphan), A).unwrap());
            assert!(probe_registration(&path(&lu, all_ports), A).unwrap());
            assert!(
                !probe_registration(&path(&lu, plain), B).unwrap(),
                "registered, but with another key"
            );
            assert_eq!(
                state(&lu).1,
                before,
                "no registration added or changed: {quirks:?}"
            );
        }
    }

    #[test]
    fn an_all_tg_pt_registration_on_lio_is_probed_again_with_all_tg_pt() {
        let (lu, [_, _, all_ports]) = setup(Quirks::lio());
        // What the retry is for: LIO refuses the plain re-statement on this registration.
        let plain = path(&lu, all_ports).pr_out(&PrOut::register(A, A));
        assert_eq!(plain.unwrap_err().kind, ErrorKind::InvalidField);
        assert!(probe_registration(&path(&lu, all_ports), A).unwrap());
        assert_eq!(lu.lock().unwrap().registered_key(all_ports), Some(A));
    }

    #[test]
    fn a_dead_path_is_an_error_not_an_answer() {
        let (lu, [plain, ..]) = setup(Quirks::lio());
        lu.lock()
            .unwrap()
            .fail_next(plain, crate::spc_model::Injected::TransportDown, 1);
        let e = probe_registration(&path(&lu, plain), A).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transport);
    }
}
