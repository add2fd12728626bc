//! What a simulated run sets up: the target, nodes × LUs × paths, which node runs which
//! operation when, the writers, the faults that are not one command's (re-logins, power cycles,
//! pauses) and each node's clock rate. A scenario is drawn from a seed, and has a text form
//! that `prfence-sim replay` reads back, so a shrunk counterexample can be replayed exactly.

use std::fmt;
use std::str::FromStr;

use crate::rng::Rng;
use crate::sched::{MS, Nanos, SECOND};
use crate::world::{Happening, Op};

/// Which target model the LUs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// SPC-4 with LIO's quirks.
    Lio,
    /// SPC-4 as written.
    Spc4,
    /// Linux nvmet's NVMe reservations (its holder-PREEMPT rule included).
    Nvmet,
}

/// One engine operation a node starts at a time on its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledOp {
    pub node: usize,
    pub op: Op,
    pub at: Nanos,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    pub target: Target,
    pub nodes: usize,
    pub lus: usize,
    pub paths: usize,
    /// Every node starts unfenced (registered on every path, the first node holding the
    /// reservation), unless a node runs a lease agent: then the LUs start bare.
    pub actions: Vec<ScheduledOp>,
    /// Nodes that write to every LU through every path while operations run.
    pub writers: Vec<usize>,
    /// Faults outside the commands, at true times.
    pub happenings: Vec<(Nanos, Happening)>,
    /// Each node's clock rate, in parts per million off true time.
    pub ppm: Vec<i64>,
    /// A paused node's clock stops (else it runs on).
    pub clock_stops: bool,
    /// Commands may be given faults (lost response, NOT READY, unit attention).
    pub faults: bool,
    /// Commands may time out (time may move past their timeout while they wait).
    pub timeouts: bool,
    /// From this true time on, no more faults or timeouts (a rerun after a partial failure).
    pub quiet_after: Option<Nanos>,
    /// Fences wait this fixed tie-break (`tiebreak=1000ms`) instead of the measured one.
    pub tie_break: Option<Nanos>,
    /// Nodes that start unregistered, fence_pr's record of their boot empty (`booting:n1`): their
    /// first `rejoin` is the first `on` of their boot.
    pub booting: Vec<usize>,
    /// Coordinator LUs (`coordinators=3`), after the `lus` data LUs (LU `lus` is the first):
    /// fences race on them and win with a majority (issue 47); 0: the first LU arbitrates.
    pub coordinators: usize,
    /// Coordinated fences report data LUs out of their reach instead of failing on them
    /// (`unreachable=report`, the admin's opt-in for an array known to be down).
    pub unreachable_report: bool,
}

/// The scenario families a random run draws from, each aimed at a kind of race.
pub const FAMILIES: [&str; 9] = [
    "mutual",
    "ring",
    "crowd",
    "churn",
    "pause",
    "refence",
    "lease",
    "rerun",
    "coordinated",
];

impl Scenario {
    /// The scenario of a random run: a family, then its parameters, all from `rng`.
    pub fn draw(rng: &mut Rng) -> Scenario {
        let family = FAMILIES[rng.below(FAMILIES.len())];
        Self::draw_family(family, rng)
    }

    pub fn draw_family(family: &str, rng: &mut Rng) -> Scenario {
        let target = match rng.below(10) {
            0..=4 => Target::Lio,
            5..=6 => Target::Spc4,
            _ => Target::Nvmet,
        };
        let mut s = Scenario {
            target,
            nodes: 2,
            lus: 1 + rng.below(4),
            paths: match rng.below(10) {
                0..=5 => 1,
                6..=7 => 2,
                8 => 3,
                _ => 4,
            },
            actions: Vec::new(),
            writers: Vec::new(),
            happenings: Vec::new(),
            ppm: Vec::new(),
            clock_stops: rng.chance(1, 2),
            faults: rng.chance(1, 3),
            timeouts: rng.chance(1, 4),
            quiet_after: None,
            tie_break: None,
            booting: Vec::new(),
            coordinators: 0,
            unreachable_report: false,
        };
        // A start offset from none to around the longest tie-break (1 s, the cap of the measured
        // one), where the two fences' steps interleave.
        let offset = |rng: &mut Rng| match rng.below(6) {
            0 => 0,
            1 => 200 * MS,
            2 => 900 * MS,
            3 => SECOND,
            4 => 1100 * MS,
            _ => rng.below(3000) as Nanos * MS,
        };
        match family {
            "mutual" => {
                s.actions = vec![
                    ScheduledOp {
                        node: 0,
                        op: Op::Fence { victim: 1 },
                        at: 0,
                    },
                    ScheduledOp {
                        node: 1,
                        op: Op::Fence { victim: 0 },
                        at: offset(rng),
                    },
                ];
                s.writers = vec![0, 1];
                // Drawn last, so the seeds of the other families keep their scenarios.
                if s.lus > 1 && rng.chance(1, 4) {
                    // Node 0's devices of one LU (mostly the arbiter) vanish before or during
                    // its fence: it cannot identify that LU, so it must not fence the others
                    // under another arbiter (P2).
                    let lu = if rng.chance(2, 3) {
                        0
                    } else {
                        rng.below(s.lus)
                    };
                    let at = if rng.chance(1, 2) {
                        0
                    } else {
                        rng.below(1500) as Nanos * MS
                    };
                    s.happenings = vec![(at, Happening::Vanish { node: 0, lu })];
                    s.actions[0].at = MS;
                }
            }
            "ring" => {
                // A fences B; C fences A while A's fence is still fanning out (issue 19).
                s.nodes = 3;
                s.lus = 2 + rng.below(7);
                s.actions = vec![
                    ScheduledOp {
                        node: 0,
                        op: Op::Fence { victim: 1 },
                        at: 0,
                    },
                    ScheduledOp {
                        node: 2,
                        op: Op::Fence { victim: 0 },
                        at: offset(rng),
                    },
                ];
                s.writers = vec![0];
            }
            "crowd" => {
                s.nodes = 3 + rng.below(3);
                s.lus = 1 + rng.below(4);
                let fences = 2 + rng.below(s.nodes);
                for _ in 0..fences {
                    let node = rng.below(s.nodes);
                    let victim = (node + 1 + rng.below(s.nodes - 1)) % s.nodes;
                    s.actions.push(ScheduledOp {
                        node,
                        op: Op::Fence { victim },
                        at: offset(rng),
                    });
                }
                s.writers = (0..s.nodes).filter(|_| rng.chance(1, 2)).collect();
            }
            "churn" => {
                s.nodes = 2 + rng.below(3);
                for _ in 0..2 + rng.below(4) {
                    let node = rng.below(s.nodes);
                    let op = match rng.below(6) {
                        0 => Op::Unfence,
                        1 => Op::Status,
                        2 => Op::Heal,
                        3 => Op::Rejoin,
                        _ => Op::Fence {
                            victim: (node + 1 + rng.below(s.nodes - 1)) % s.nodes,
                        },
                    };
                    s.actions.push(ScheduledOp {
                        node,
                        op,
                        at: rng.below(4000) as Nanos * MS,
                    });
                }
                for _ in 0..rng.below(3) {
                    s.happenings.push((
                        rng.below(4000) as Nanos * MS,
                        Happening::Relogin {
                            node: rng.below(s.nodes),
                            lu: rng.below(s.lus),
                            path: rng.below(s.paths),
                        },
                    ));
                }
                if rng.chance(1, 10) {
                    s.happenings.push((
                        rng.below(4000) as Nanos * MS,
                        Happening::PowerCycle {
                            lu: rng.below(s.lus),
                        },
                    ));
                }
                s.writers = (0..s.nodes).filter(|_| rng.chance(1, 2)).collect();
                if rng.chance(1, 2) {
                    s.actions.push(ScheduledOp {
                        node: rng.below(s.nodes),
                        op: Op::Watch,
                        at: 0,
                    });
                }
                // Drawn last, so the scenarios of the other families' seeds stay as they were.
                if rng.chance(1, 3) {
                    s.boot_one(rng);
                }
            }
            "pause" => {
                // The victim freezes mid-write and wakes up after it was fenced.
                s.nodes = 2 + rng.below(2);
                let paused_at = rng.below(500) as Nanos * MS;
                s.happenings = vec![
                    (paused_at, Happening::Pause { node: 0 }),
                    (
                        paused_at + (1 + rng.below(20)) as Nanos * 500 * MS,
                        Happening::Resume { node: 0 },
                    ),
                ];
                s.actions = vec![ScheduledOp {
                    node: 1,
                    op: Op::Fence { victim: 0 },
                    at: paused_at + rng.below(1000) as Nanos * MS,
                }];
                if s.nodes == 3 && rng.chance(1, 2) {
                    s.actions.push(ScheduledOp {
                        node: 0,
                        op: Op::Fence { victim: 2 },
                        at: 0,
                    });
                }
                s.writers = vec![0];
                if rng.chance(1, 2) {
                    s.actions.push(ScheduledOp {
                        node: 0,
                        op: Op::Watch,
                        at: 0,
                    });
                }
            }
            "lease" => {
                // Lease-mode agents on every node; the holder may freeze and wake up after a
                // standby took over (its writes must be refused).
                s.nodes = 2 + rng.below(2);
                s.lus = 1 + rng.below(2);
                s.actions = (0..s.nodes)
                    .map(|node| ScheduledOp {
                        node,
                        op: Op::Lease,
                        at: rng.below(1500) as Nanos * MS,
                    })
                    .collect();
                s.writers = (0..s.nodes).collect();
                if rng.chance(2, 3) {
                    let node = rng.below(s.nodes);
                    let at = (2000 + rng.below(6000)) as Nanos * MS;
                    s.happenings = vec![
                        (at, Happening::Pause { node }),
                        (
                            at + (1000 + rng.below(8000)) as Nanos * MS,
                            Happening::Resume { node },
                        ),
                    ];
                }
            }
            "boot" => {
                // `--family boot`; random runs meet it inside churn.
                s.nodes = 2 + rng.below(2);
                s.faults = rng.chance(2, 3);
                s.writers = (0..s.nodes).filter(|_| rng.chance(1, 2)).collect();
                s.boot_one(rng);
            }
            "coordinated" => s.draw_coordinated(rng, offset),
            "rerun" => {
                // P4: a fence under faults and timeouts, then the same fence once the faults are
                // over: it must succeed, whatever the first one left behind.
                s.nodes = 2 + rng.below(2);
                s.actions = vec![
                    ScheduledOp {
                        node: 0,
                        op: Op::Fence { victim: 1 },
                        at: 0,
                    },
                    ScheduledOp {
                        node: 0,
                        op: Op::Refence { victim: 1 },
                        at: 200 * SECOND,
                    },
                ];
                s.faults = true;
                s.timeouts = true;
                s.quiet_after = Some(150 * SECOND);
            }
            _ => {
                // "refence": a fence, then the same fence again once all is quiet (P4).
                s.nodes = 2 + rng.below(2);
                s.actions = vec![
                    ScheduledOp {
                        node: 0,
                        op: Op::Fence { victim: 1 },
                        at: 0,
                    },
                    ScheduledOp {
                        node: 0,
                        op: Op::Refence { victim: 1 },
                        at: 200 * SECOND,
                    },
                ];
                s.faults = false;
                s.timeouts = false;
            }
        }
        s.ppm = (0..s.nodes)
            .map(|_| rng.below(4001) as i64 - 2000)
            .collect();
        s.happenings.sort_by_key(|(t, _)| *t);
        s
    }
}

impl Scenario {
    /// Issue 47: 3 or 5 coordinators, each its own failure domain, 1-3 data LUs; two to four
    /// nodes fencing each other (a mutual fence, a ring, a crowd), and arrays lost: one
    /// coordinator's from every node (an array down), from one node only (a split view), or from
    /// the node being fenced together with a data LU (a site lost with its node); before the
    /// race or during it. Some nodes run their agent, some write.
    fn draw_coordinated(&mut self, rng: &mut Rng, offset: impl Fn(&mut Rng) -> Nanos) {
        self.coordinators = if rng.chance(3, 4) { 3 } else { 5 };
        self.lus = 1 + rng.below(3);
        self.nodes = 2 + rng.below(3);
        let fences = match self.nodes {
            2 => 2,
            n => 2 + rng.below(n),
        };
        for i in 0..fences {
            let node = if i < 2 { i } else { rng.below(self.nodes) };
            let victim = if i < 2 {
                1 - i
            } else {
                (node + 1 + rng.below(self.nodes - 1)) % self.nodes
            };
            self.actions.push(ScheduledOp {
                node,
                op: Op::Fence { victim },
                at: if i == 0 { 0 } else { offset(rng) },
            });
        }
        self.writers = (0..self.nodes).filter(|_| rng.chance(1, 2)).collect();
        let when = |rng: &mut Rng| {
            if rng.chance(1, 2) {
                0
            } else {
                rng.below(2000) as Nanos * MS
            }
        };
        let coordinator =
            |rng: &mut Rng, lus: usize, coordinators: usize| lus + rng.below(coordinators);
        let losses = rng.below(3);
        for _ in 0..losses {
            let lu = coordinator(rng, self.lus, self.coordinators);
            let at = when(rng);
            match rng.below(3) {
                0 => {
                    for node in 0..self.nodes {
                        self.happenings.push((at, Happening::Cut { node, lu }));
                    }
                }
                1 => {
                    let node = rng.below(self.nodes);
                    self.happenings.push((at, Happening::Cut { node, lu }));
                }
                _ => {
                    // A site: node 1, the first fence's victim, frozen with its array (one
                    // coordinator and data LU 0) cut off from every other node.
                    for node in (0..self.nodes).filter(|&n| n != 1) {
                        self.happenings.push((at, Happening::Cut { node, lu }));
                        self.happenings.push((at, Happening::Cut { node, lu: 0 }));
                    }
                    self.happenings.push((at, Happening::Pause { node: 1 }));
                    // The admin who knows that array is down lets the fences report its data
                    // LU instead of failing on it.
                    self.unreachable_report |= rng.chance(1, 2);
                    self.happenings.push((
                        at + (1 + rng.below(10)) as Nanos * 500 * MS,
                        Happening::Resume { node: 1 },
                    ));
                }
            }
        }
        for node in 0..self.nodes {
            if rng.chance(1, 3) {
                self.actions.push(ScheduledOp {
                    node,
                    op: Op::Watch,
                    at: 0,
                });
            }
        }
    }

    /// One node boots during the run: unregistered, its record empty; its first `on` (under
    /// the scenario's faults), a fence of it by another node, and its `on` again in the same
    /// boot (Pacemaker's retry, or its re-unfencing of a node it just fenced).
    fn boot_one(&mut self, rng: &mut Rng) {
        let node = rng.below(self.nodes);
        let fencer = (node + 1 + rng.below(self.nodes - 1)) % self.nodes;
        self.booting = vec![node];
        self.actions.extend([
            ScheduledOp {
                node,
                op: Op::Rejoin,
                at: rng.below(500) as Nanos * MS,
            },
            ScheduledOp {
                node: fencer,
                op: Op::Fence { victim: node },
                at: rng.below(1500) as Nanos * MS,
            },
            ScheduledOp {
                node,
                op: Op::Rejoin,
                at: (500 + rng.below(3000)) as Nanos * MS,
            },
        ]);
        if rng.chance(1, 4) {
            self.happenings.push((
                rng.below(3000) as Nanos * MS,
                Happening::PowerCycle {
                    lu: rng.below(self.lus),
                },
            ));
        }
    }
}

fn at_ms(ns: Nanos) -> String {
    format!("{}ms", ns / MS)
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match self.target {
            Target::Lio => "lio",
            Target::Spc4 => "spc4",
            Target::Nvmet => "nvmet",
        };
        write!(
            f,
            "{target} nodes={} lus={} paths={}",
            self.nodes, self.lus, self.paths
        )?;
        if self.coordinators > 0 {
            write!(f, " coordinators={}", self.coordinators)?;
        }
        if self.unreachable_report {
            write!(f, " unreachable=report")?;
        }
        for a in &self.actions {
            write!(f, " n{}:{}@{}", a.node, a.op, at_ms(a.at))?;
        }
        for w in &self.writers {
            write!(f, " writer:n{w}")?;
        }
        for (t, h) in &self.happenings {
            match h {
                Happening::Relogin { node, lu, path } => {
                    write!(f, " relogin:n{node}/l{lu}/p{path}@{}", at_ms(*t))?
                }
                Happening::PowerCycle { lu } => write!(f, " powercycle:l{lu}@{}", at_ms(*t))?,
                Happening::Pause { node } => write!(f, " pause:n{node}@{}", at_ms(*t))?,
                Happening::Resume { node } => write!(f, " resume:n{node}@{}", at_ms(*t))?,
                Happening::Vanish { node, lu } => write!(f, " vanish:n{node}/l{lu}@{}", at_ms(*t))?,
                Happening::Cut { node, lu } => write!(f, " cut:n{node}/l{lu}@{}", at_ms(*t))?,
            }
        }
        let ppm: Vec<String> = self.ppm.iter().map(ToString::to_string).collect();
        write!(f, " ppm={}", ppm.join(","))?;
        for (on, name) in [
            (self.clock_stops, "clock-stops"),
            (self.faults, "faults"),
            (self.timeouts, "timeouts"),
        ] {
            if on {
                write!(f, " {name}")?;
            }
        }
        if let Some(at) = self.quiet_after {
            write!(f, " quiet@{}", at_ms(at))?;
        }
        if let Some(wait) = self.tie_break {
            write!(f, " tiebreak={}", at_ms(wait))?;
        }
        for b in &self.booting {
            write!(f, " booting:n{b}")?;
        }
        Ok(())
    }
}

/// Why a scenario's text form does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn number<T: FromStr>(s: &str, what: &str) -> Result<T, ParseError> {
    s.parse()
        .map_err(|_| ParseError(format!("{what}: `{s}` is not a number")))
}

fn node(s: &str) -> Result<usize, ParseError> {
    number(s.strip_prefix('n').unwrap_or(s), "node")
}

fn time(s: &str) -> Result<Nanos, ParseError> {
    let ms = s
        .strip_suffix("ms")
        .ok_or_else(|| ParseError(format!("time `{s}` must end in ms")))?;
    Ok(number::<Nanos>(ms, "time")? * MS)
}

fn op(s: &str) -> Result<Op, ParseError> {
    let victim = |s: &str, name: &str| -> Result<usize, ParseError> {
        node(
            s.strip_prefix(name)
                .and_then(|r| r.strip_prefix('('))
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| ParseError(format!("operation `{s}`")))?,
        )
    };
    Ok(match s {
        "unfence" => Op::Unfence,
        "rejoin" => Op::Rejoin,
        "status" => Op::Status,
        "heal" => Op::Heal,
        "register" => Op::Register,
        "lease" => Op::Lease,
        "watch" => Op::Watch,
        _ if s.starts_with("fence(") => Op::Fence {
            victim: victim(s, "fence")?,
        },
        _ if s.starts_with("refence(") => Op::Refence {
            victim: victim(s, "refence")?,
        },
        _ => return Err(ParseError(format!("unknown operation `{s}`"))),
    })
}

impl FromStr for Scenario {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut words = text.split_whitespace();
        let target = match words.next() {
            Some("lio") => Target::Lio,
            Some("spc4") => Target::Spc4,
            Some("nvmet") => Target::Nvmet,
            other => return Err(ParseError(format!("unknown target {other:?}"))),
        };
        let mut s = Scenario {
            target,
            nodes: 2,
            lus: 1,
            paths: 1,
            actions: Vec::new(),
            writers: Vec::new(),
            happenings: Vec::new(),
            ppm: Vec::new(),
            clock_stops: false,
            faults: false,
            timeouts: false,
            quiet_after: None,
            tie_break: None,
            booting: Vec::new(),
            coordinators: 0,
            unreachable_report: false,
        };
        for word in words {
            let (key, value) = word.split_once(['=', ':']).unwrap_or((word, ""));
            match key {
                "nodes" => s.nodes = number(value, "nodes")?,
                "lus" => s.lus = number(value, "lus")?,
                "paths" => s.paths = number(value, "paths")?,
                "coordinators" => s.coordinators = number(value, "coordinators")?,
                "unreachable" if value == "report" => s.unreachable_report = true,
                "writer" => s.writers.push(node(value)?),
                "booting" => s.booting.push(node(value)?),
                "ppm" => {
                    s.ppm = value
                        .split(',')
                        .map(|p| number(p, "ppm"))
                        .collect::<Result<_, _>>()?
                }
                "clock-stops" => s.clock_stops = true,
                "faults" => s.faults = true,
                "timeouts" => s.timeouts = true,
                "tiebreak" => s.tie_break = Some(time(value)?),
                _ if word.starts_with("quiet@") => {
                    s.quiet_after = Some(time(word.trim_start_matches("quiet@"))?)
                }
                "relogin" | "powercycle" | "pause" | "resume" | "vanish" | "cut" => {
                    let (what, at) = value
                        .split_once('@')
                        .ok_or_else(|| ParseError(format!("`{word}` needs @TIME")))?;
                    let at = time(at)?;
                    let happening = match key {
                        "relogin" => {
                            let parts: Vec<&str> = what.split('/').collect();
                            let [n, l, p] = parts[..] else {
                                return Err(ParseError(format!("`{word}`: nN/lL/pP")));
                            };
                            Happening::Relogin {
                                node: node(n)?,
                                lu: number(l.trim_start_matches('l'), "lu")?,
                                path: number(p.trim_start_matches('p'), "path")?,
                            }
                        }
                        "powercycle" => Happening::PowerCycle {
                            lu: number(what.trim_start_matches('l'), "lu")?,
                        },
                        "vanish" | "cut" => {
                            let (n, l) = what
                                .split_once('/')
                                .ok_or_else(|| ParseError(format!("`{word}`: nN/lL")))?;
                            let (node, lu) = (node(n)?, number(l.trim_start_matches('l'), "lu")?);
                            if key == "cut" {
                                Happening::Cut { node, lu }
                            } else {
                                Happening::Vanish { node, lu }
                            }
                        }
                        "pause" => Happening::Pause { node: node(what)? },
                        _ => Happening::Resume { node: node(what)? },
                    };
                    s.happenings.push((at, happening));
                }
                _ if key.starts_with('n') => {
                    let (op_text, at) = value
                        .split_once('@')
                        .ok_or_else(|| ParseError(format!("`{word}` needs @TIME")))?;
                    s.actions.push(ScheduledOp {
                        node: node(key)?,
                        op: op(op_text)?,
                        at: time(at)?,
                    });
                }
                _ => return Err(ParseError(format!("unknown word `{word}`"))),
            }
        }
        if s.ppm.len() != s.nodes {
            s.ppm.resize(s.nodes, 0);
        }
        s.happenings.sort_by_key(|(t, _)| *t);
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_reads_back_as_the_same_scenario() {
        let mut rng = Rng::new(7);
        for _ in 0..500 {
            let s = Scenario::draw(&mut rng);
            let text = s.to_string();
            assert_eq!(text.parse::<Scenario>(), Ok(s), "{text}");
        }
    }
}
