//! The descriptor budget of a prfence process: one descriptor per LU path it holds open (SG_IO
//! and NVMe keep each path open while they use it) plus what the process holds itself. The
//! default soft limit (1024, for a shell as for a systemd service such as pacemaker.service) is
//! smaller than 256 LUs with 4 paths each, so every front end raises the soft limit to what its
//! paths need, up to the hard limit, as systemd advises programs that need many descriptors. A
//! path that still finds none fails to open (EMFILE), and is reported as such.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// What a prfence process holds besides its LU paths, rounded up: the packaged agent unit's
/// comment above `LimitNOFILE=` counts 87 at most (the 18 `agent::DescriptorReserve` keeps for
/// the self-fence included); the CLI and fence_pr hold fewer.
pub const OWN: u64 = 128;

/// Descriptors needed for `paths` LU paths.
pub fn need(paths: usize) -> u64 {
    OWN.saturating_add(u64::try_from(paths).unwrap_or(u64::MAX))
}

/// Descriptors to spare beyond what `paths` LU paths need under the soft limit in force (`0`
/// when it cannot be read): what a process may keep open for its own speed, never for a path.
pub fn to_spare(paths: usize) -> usize {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| {
        usize::try_from(soft.saturating_sub(need(paths))).unwrap_or(usize::MAX)
    })
}

/// The descriptor limit cannot hold the LUs' paths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{lus} LU(s) with {paths} path(s) need {need} descriptors ({paths} + {OWN} for prfence \
     itself), but the limit is {limit}"
)]
pub struct TooFewDescriptors {
    pub lus: usize,
    pub paths: usize,
    pub need: u64,
    pub limit: u64,
}

impl TooFewDescriptors {
    /// What to set for a process started by systemd `unit`.
    pub fn raise_in(&self, unit: &str) -> String {
        let need = self.need;
        format!(
            "raise LimitNOFILE to at least {need} (`systemctl edit {unit}`, [Service] \
             LimitNOFILE={need})"
        )
    }
}

/// Checks `paths` against the soft limit, raising it up to the hard limit when that is enough.
/// Returns the soft limit in force. When even the hard limit is too small, the soft limit is
/// raised to it all the same (as many paths as fit still open) and the shortfall returned.
pub fn fit(lus: usize, paths: usize) -> Result<u64, TooFewDescriptors> {
    let need = need(paths);
    let too_few = |limit| TooFewDescriptors {
        lus,
        paths,
        need,
        limit,
    };
    // Without getrlimit nothing can be judged: the opens will say EMFILE per LU if it comes to it.
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Ok(u64::MAX);
    };
    if need <= soft {
        return Ok(soft);
    }
    if need > hard {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
        return Err(too_few(hard));
    }
    match setrlimit(Resource::RLIMIT_NOFILE, need, hard) {
        Ok(()) => {
            tracing::info!(from = soft, to = need, "raised the soft descriptor limit");
            Ok(need)
        }
        Err(_) => Err(too_few(soft)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_is_the_paths_and_the_agents_own() {
        assert_eq!(need(0), OWN);
        // The case: 1024 LUs x 4 paths do not fit the old LimitNOFILE=4096.
        assert!(need(1024 * 4) > 4096);
    }

    /// What is spare is what the soft limit leaves beyond the paths and prfence's own (never
    /// past the hard limit), and nothing once the paths take it all. (The soft limit may be
    /// raised and put back by the test below meanwhile: only the hard one is compared.)
    #[test]
    fn what_is_spare_is_beyond_the_paths_and_the_own() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let spare = u64::try_from(to_spare(10)).unwrap();
        assert!(spare.saturating_add(OWN + 10) <= hard, "{spare} of {hard}");
        assert_eq!(to_spare(usize::MAX), 0);
    }

    /// The packaged unit's limit holds the most LUs the agent takes with 15 paths each.
    #[test]
    fn the_packaged_limit_fits_the_largest_configuration() {
        let unit = include_str!("../packaging/prfence-agent.service");
        let limit: u64 = unit
            .lines()
            .find_map(|l| l.strip_prefix("LimitNOFILE="))
            .and_then(|v| v.trim().parse().ok())
            .expect("LimitNOFILE= in the unit");
        assert!(need(crate::MAX_DEVICES * 15) <= limit, "{limit}");
    }

    /// Below the hard limit the soft one is raised; above it the soft one is raised to the hard
    /// one and the shortfall named (the agent refuses to start with it, naming the number to
    /// set). The limit is the whole test binary's: it is only ever raised here (never lowered
    /// under a test running beside), and put back.
    #[test]
    fn the_soft_limit_is_raised_or_the_start_refused() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let paths = |need: u64| usize::try_from(need - OWN).unwrap();
        assert_eq!(fit(1, paths(soft)), Ok(soft), "what fits is left alone");
        if soft < hard {
            let raised = fit(1, paths(soft + 1));
            let after = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
            setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
            assert_eq!(raised, Ok(soft + 1));
            assert_eq!(after, (soft + 1, hard));
        }
        if hard < u64::MAX / 2 {
            let refused = fit(3, paths(hard + 1)).unwrap_err();
            let after = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
            setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
            assert_eq!(after, (hard, hard), "raised as far as it goes");
            assert_eq!(refused.limit, hard);
            let text = refused.raise_in("prfence-agent.service");
            assert!(
                text.contains(&format!("LimitNOFILE={}", hard + 1)),
                "{text}"
            );
            assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (soft, hard));
        }
    }
}
