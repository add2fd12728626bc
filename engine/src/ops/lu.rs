//! Working on one LU through its paths: path bookkeeping, reads through the first live path, the
//! shared steps (preempt with fallback, make sure a reservation exists, verify) and the report.

use crate::pr::{FullStatus, Key, PrOut, ReadKeys, ReadReservation};
use crate::transport::{CommandError, ErrorKind, PrOutReport, PrTransport};

use super::{
    FENCING_TYPE, Failure, LuReport, LuTarget, PathReport, PathUse, ReservationView, Verdict,
};

/// Why work on a LU stopped early: the verdict and what to tell the operator.
#[derive(Debug)]
pub(super) struct Stop {
    pub verdict: Verdict,
    pub message: Failure,
}

impl Stop {
    pub fn failed(message: impl Into<Failure>) -> Self {
        Stop {
            verdict: Verdict::Failed,
            message: message.into(),
        }
    }

    pub fn fenced(message: impl Into<Failure>) -> Self {
        Stop {
            verdict: Verdict::ThisNodeFenced,
            message: message.into(),
        }
    }
}

impl From<CommandError> for Stop {
    fn from(e: CommandError) -> Self {
        Stop::failed(e)
    }
}

/// A dead path: its failure is below the PR layer, so another path may still work.
pub(super) fn is_dead(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Timeout | ErrorKind::Transport | ErrorKind::Open
    )
}

/// What a PREEMPT [AND ABORT] of the victim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Preempted {
    /// The command succeeded.
    Done,
    /// RESERVATION CONFLICT, and a re-read shows the victim gone anyway (someone else fenced it).
    VictimGoneMeanwhile,
    /// RESERVATION CONFLICT, and a re-read shows our own key gone: we were preempted.
    OwnKeyGone,
    /// RESERVATION CONFLICT with both keys still present: this path's nexus is not registered.
    PathNotRegistered,
}

/// What one look at an LU showed: its registrations' keys and its reservation, at one
/// PRgeneration when READ FULL STATUS answered, or from READ KEYS then READ RESERVATION.
#[derive(Debug, Clone)]
pub(super) struct LuState {
    pub keys: ReadKeys,
    pub reservation: ReadReservation,
}

impl LuState {
    pub fn has(&self, key: Key) -> bool {
        self.keys.keys.contains(&key)
    }

    pub fn reserved(&self) -> bool {
        self.reservation.reservation.is_some()
    }
}

/// One LU being worked on, with everything the report needs.
pub(super) struct LuWork<'a, T> {
    pub target: &'a LuTarget<T>,
    pub paths: Vec<PathReport>,
    pub notes: Vec<String>,
    pub keys: Option<ReadKeys>,
    pub reservation: Option<ReadReservation>,
    /// PREEMPT AND ABORT was refused once; use PREEMPT from then on.
    preempt_and_abort_refused: bool,
    /// READ FULL STATUS was refused once; read keys and reservation separately from then on.
    full_status_refused: bool,
    /// The LU as the transport saw it right after our last command, a PREEMPT, when it looked
    /// ([`crate::transport::PrOutReport::observed`]); gone with the next command of any kind.
    seen_after_preempt: Option<LuState>,
}

impl<'a, T: PrTransport> LuWork<'a, T> {
    pub fn new(target: &'a LuTarget<T>) -> Self {
        LuWork {
            target,
            paths: target
                .paths
                .iter()
                .map(|p| PathReport {
                    device: p.device().display().to_string(),
                    state: PathUse::Unused,
                    error: None,
                })
                .collect(),
            notes: Vec::new(),
            keys: None,
            reservation: None,
            preempt_and_abort_refused: false,
            full_status_refused: false,
            seen_after_preempt: None,
        }
    }

    pub fn device(&self, index: usize) -> String {
        self.paths
            .get(index)
            .map(|p| p.device.clone())
            .unwrap_or_default()
    }

    pub fn is_dead_path(&self, index: usize) -> bool {
        self.paths
            .get(index)
            .is_some_and(|p| p.state == PathUse::Dead)
    }

    /// Indexes of the paths not (yet) known to be dead.
    pub fn live_paths(&self) -> Vec<usize> {
        (0..self.paths.len())
            .filter(|&i| !self.is_dead_path(i))
            .collect()
    }

    /// The path answered (e.g. with RESERVATION CONFLICT): the target spoke, the path is fine.
    pub fn mark_answered(&mut self, index: usize) {
        if let Some(path) = self.paths.get_mut(index) {
            path.state = PathUse::Ok;
            path.error = None;
        }
    }

    fn mark(&mut self, index: usize, state: PathUse, error: Option<Failure>) {
        if let Some(path) = self.paths.get_mut(index) {
            // A path that failed once stays reported as failed even if a later read worked.
            if path.state == PathUse::Unused || state != PathUse::Ok {
                path.state = state;
            }
            if error.is_some() {
                path.error = error;
            }
        }
    }

    /// Records the result of one command on one path; dead paths are noted, not fatal.
    pub fn record<R>(
        &mut self,
        index: usize,
        result: Result<R, CommandError>,
    ) -> Result<R, CommandError> {
        self.seen_after_preempt = None;
        match &result {
            Ok(_) => self.mark(index, PathUse::Ok, None),
            Err(e) if is_dead(e.kind) => self.mark(index, PathUse::Dead, Some(e.clone().into())),
            Err(e) => self.mark(index, PathUse::Failed, Some(e.clone().into())),
        }
        result
    }

    fn path(&self, index: usize) -> Option<&'a T> {
        self.target.paths.get(index)
    }

    /// Runs `f` on path `index` and records the result.
    pub fn on<R>(
        &mut self,
        index: usize,
        f: impl FnOnce(&T) -> Result<R, CommandError>,
    ) -> Result<R, CommandError> {
        let Some(path) = self.path(index) else {
            return Err(CommandError::without_completion(
                std::path::Path::new(self.target.id.as_str()),
                crate::transport::Command::Open,
                ErrorKind::Open,
                format!("no path number {index}"),
            ));
        };
        let result = f(path);
        self.record(index, result)
    }

    /// Runs `f` on the first live path that answers; dead paths are skipped and noted. Returns
    /// the path used. Fails with the last error when no path answers, or at once on an error that
    /// is not a dead path (the LU answered: another path would say the same).
    pub fn on_any<R>(
        &mut self,
        f: impl Fn(&T) -> Result<R, CommandError>,
    ) -> Result<(usize, R), Stop> {
        let mut last = None;
        for index in self.live_paths() {
            match self.on(index, &f) {
                Ok(r) => return Ok((index, r)),
                Err(e) if is_dead(e.kind) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(match last {
            Some(e) => Stop::failed(Failure::after("no path answered; the last error", e)),
            None => Stop::failed("every path is dead"),
        })
    }

    pub fn read_keys_any(&mut self) -> Result<(usize, ReadKeys), Stop> {
        let (index, keys) = self.on_any(|p| p.read_keys())?;
        self.keys = Some(keys.clone());
        Ok((index, keys))
    }

    /// READ FULL STATUS through the first live path that answers; `None` where the target does
    /// not have it (the tgt target), and from then on without asking again. Recorded for the
    /// report.
    pub fn read_full_status_any(&mut self) -> Result<Option<(usize, FullStatus)>, Stop> {
        if self.full_status_refused {
            return Ok(None);
        }
        let mut last = None;
        for index in self.live_paths() {
            match self.on(index, |p| p.read_full_status()) {
                Ok(status) => {
                    self.keys = Some(status.keys());
                    self.reservation = Some(status.reservation());
                    return Ok(Some((index, status)));
                }
                Err(e) if matches!(e.kind, ErrorKind::InvalidField | ErrorKind::NotSupported) => {
                    // The target answered: the path is fine, the service action is not there.
                    self.mark_answered(index);
                    self.full_status_refused = true;
                    return Ok(None);
                }
                Err(e) if is_dead(e.kind) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(match last {
            Some(e) => Stop::failed(Failure::after("no path answered; the last error", e)),
            None => Stop::failed("every path is dead"),
        })
    }

    /// One look at the LU through the first live path that answers: READ FULL STATUS, one
    /// command, where the target has it (the tgt target does not: then READ KEYS and READ
    /// RESERVATION through the same path). Recorded for the report.
    pub fn read_state(&mut self) -> Result<(usize, LuState), Stop> {
        if let Some((index, status)) = self.read_full_status_any()? {
            let state = LuState {
                keys: status.keys(),
                reservation: status.reservation(),
            };
            return Ok((index, state));
        }
        let (index, keys) = self.read_keys_any()?;
        let reservation = self.on(index, |p| p.read_reservation())?;
        self.reservation = Some(reservation.clone());
        Ok((index, LuState { keys, reservation }))
    }

    /// READ RESERVATION for the report only (e.g. to show who holds the LU when we stop).
    pub fn note_reservation(&mut self, index: usize) {
        if let Ok(reservation) = self.on(index, |p| p.read_reservation()) {
            self.reservation = Some(reservation);
        }
    }

    pub fn read_keys_on(&mut self, index: usize) -> Result<ReadKeys, CommandError> {
        let keys = self.on(index, |p| p.read_keys())?;
        self.keys = Some(keys.clone());
        Ok(keys)
    }

    /// PREEMPT AND ABORT `victim` from path `index`, falling back to PREEMPT on targets that
    /// refuse it (ILLEGAL REQUEST), and telling a conflict's causes apart by re-reading.
    pub fn preempt(&mut self, index: usize, own: Key, victim: Key) -> Result<Preempted, Stop> {
        if !self.preempt_and_abort_refused {
            let result = self.on(index, |p| {
                p.pr_out(&PrOut::preempt_and_abort(own, victim, FENCING_TYPE))
            });
            match result {
                Ok(report) => return Ok(self.preempted(report)),
                Err(e) if e.kind == ErrorKind::InvalidField => {
                    self.preempt_and_abort_refused = true;
                    self.notes.push(format!(
                        "{} refused PREEMPT AND ABORT (ILLEGAL REQUEST); fell back to PREEMPT, so \
                         commands the victim already queued are not aborted",
                        self.device(index)
                    ));
                    // The refusal marked the path failed; it is fine for everything else.
                    self.mark_answered(index);
                }
                Err(e) if e.kind == ErrorKind::ReservationConflict => {
                    return self.after_conflict(index, own, victim);
                }
                Err(e) => return Err(e.into()),
            }
        }
        match self.on(index, |p| {
            p.pr_out(&PrOut::preempt(own, victim, FENCING_TYPE))
        }) {
            Ok(report) => Ok(self.preempted(report)),
            Err(e) if e.kind == ErrorKind::ReservationConflict => {
                self.after_conflict(index, own, victim)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn preempted(&mut self, report: PrOutReport) -> Preempted {
        self.seen_after_preempt = report
            .observed
            .map(|(keys, reservation)| LuState { keys, reservation });
        Preempted::Done
    }

    fn after_conflict(&mut self, index: usize, own: Key, victim: Key) -> Result<Preempted, Stop> {
        // The conflict is the target's answer, not a broken path.
        self.mark_answered(index);
        let keys = self.read_keys_on(index)?;
        Ok(if !keys.keys.contains(&own) {
            Preempted::OwnKeyGone
        } else if !keys.keys.contains(&victim) {
            Preempted::VictimGoneMeanwhile
        } else {
            Preempted::PathNotRegistered
        })
    }

    /// Makes sure a reservation exists, reserving with our key from one of `candidates` (paths
    /// registered with it) if none does. Someone else's reservation is kept (and noted): under
    /// WERO any registrant may write, and taking it over is not ours to decide.
    pub fn ensure_reservation(&mut self, own: Key, candidates: &[usize]) -> Result<(), Stop> {
        let mut last_error = None;
        for &index in candidates {
            if self.is_dead_path(index) {
                continue;
            }
            let current = match self.on(index, |p| p.read_reservation()) {
                Ok(r) => r,
                Err(e) if is_dead(e.kind) => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(held) = current.reservation.clone() {
                if held.rtype != FENCING_TYPE {
                    self.notes.push(format!(
                        "the LU is reserved as {} ({}), not {FENCING_TYPE}; left as it is",
                        held.rtype,
                        held.rtype.description()
                    ));
                }
                self.reservation = Some(current);
                return Ok(());
            }
            match self.on(index, |p| p.pr_out(&PrOut::reserve(own, FENCING_TYPE))) {
                Ok(_) => {
                    self.notes.push(format!(
                        "reserved ({FENCING_TYPE}) through {}",
                        self.device(index)
                    ));
                    return Ok(());
                }
                // Someone reserved first (conflict), or this nexus is not registered (LIO says
                // NOT READY then): look again, or try the next path.
                Err(e) => {
                    if !is_dead(e.kind) {
                        self.mark_answered(index);
                    }
                    last_error = Some(e);
                }
            }
        }
        // A reservation made by someone else meanwhile is as good as ours.
        if let Ok((_, again)) = self.on_any(|p| p.read_reservation())
            && again.reservation.is_some()
        {
            self.reservation = Some(again);
            return Ok(());
        }
        Err(Stop::failed(match last_error {
            Some(e) => Failure::after("could not create a reservation", e),
            None => "could not create a reservation: no live registered path".into(),
        }))
    }

    /// Looks at the LU after our last change ([`LuWork::state_after_change`]) for the verdict's
    /// evidence and checks it ([`LuWork::check`]).
    pub fn verify(
        &mut self,
        own: Key,
        gone: Option<Key>,
        reservation_required: bool,
    ) -> Result<(), Stop> {
        let state = self.state_after_change()?;
        self.check(&state, own, gone, reservation_required)
    }

    /// The LU after our last change (P1's evidence is the target's answer after it): the
    /// transport's own look right after our PREEMPT when it took one and nothing was sent since,
    /// else one more look now.
    pub fn state_after_change(&mut self) -> Result<LuState, Stop> {
        match self.seen_after_preempt.take() {
            Some(state) => {
                self.keys = Some(state.keys.clone());
                self.reservation = Some(state.reservation.clone());
                Ok(state)
            }
            None => Ok(self.read_state()?.1),
        }
    }

    /// Checks a look at the LU: our key present, `gone` (the victim) absent, a reservation if
    /// `reservation_required`.
    pub fn check(
        &self,
        state: &LuState,
        own: Key,
        gone: Option<Key>,
        reservation_required: bool,
    ) -> Result<(), Stop> {
        if !state.has(own) {
            return Err(Stop::fenced(format!(
                "verify: own key {own} is not registered on the LU any more (preempted meanwhile)"
            )));
        }
        if let Some(victim) = gone
            && state.has(victim)
        {
            return Err(Stop::failed(format!(
                "verify: victim key {victim} is still registered"
            )));
        }
        if reservation_required && !state.reserved() {
            return Err(Stop::failed(
                "verify: no reservation exists, so unregistered initiators could still write",
            ));
        }
        Ok(())
    }

    /// The final report; `result` is the outcome of the steps.
    pub fn finish(mut self, result: Result<Verdict, Stop>, ok_verdicts: &[Verdict]) -> LuReport {
        let (verdict, error) = match result {
            Ok(v) => (v, None),
            Err(stop) => (stop.verdict, Some(stop.message)),
        };
        let used: Vec<String> = self
            .paths
            .iter()
            .filter(|p| p.state == PathUse::Ok)
            .map(|p| p.device.clone())
            .collect();
        for dead in self.paths.iter().filter(|p| p.state == PathUse::Dead) {
            if !used.is_empty() {
                self.notes.push(format!(
                    "path {} dead, handled through {}",
                    dead.device,
                    used.join(", ")
                ));
            }
        }
        let notes = self.notes.into_iter().map(Failure::from).collect();
        LuReport {
            lu: self.target.id.clone(),
            ok: error.is_none() && ok_verdicts.contains(&verdict),
            verdict,
            paths: self.paths,
            keys: self.keys.as_ref().map(|k| k.keys.clone()),
            generation: self
                .reservation
                .as_ref()
                .map(|r| r.generation)
                .or(self.keys.as_ref().map(|k| k.generation)),
            reservation: self
                .reservation
                .and_then(|r| r.reservation)
                .map(|r| ReservationView {
                    key: r.key,
                    rtype: r.rtype,
                }),
            notes,
            error,
        }
    }
}
