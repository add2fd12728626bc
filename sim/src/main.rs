//! `prfence-sim`: long runs, exhaustive runs and replays of the deterministic simulation.
//!
//!     prfence-sim run [--schedules N] [--seed S] [--jobs J] [--family F]
//!     prfence-sim replay --seed S
//!     prfence-sim replay --scenario 'TEXT' [--picks '0,3,1,…']
//!     prfence-sim exhaustive --scenario 'TEXT' [--limit N]

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prfence_sim::explore::{self, Replay, ScheduleRun};
use prfence_sim::rng::Rng;
use prfence_sim::scenario::Scenario;

const USAGE: &str = "\
prfence-sim: the deterministic simulation of several nodes fencing each other (issue 19)

  prfence-sim run [--schedules N] [--seed S] [--jobs J] [--family F | --scenario TEXT]
      N random schedules (default 100000) from seed S (default 1) on J threads, each kept on
      one CPU (default: one per CPU); F limits the scenarios to one family (mutual, ring,
      crowd, churn, pause, refence, lease, rerun, coordinated), TEXT to one scenario (random
      and PCT schedules of it). Stops at the first broken property, shrinks it and prints the
      counterexample; --keep-going counts the broken properties per kind of scenario instead
      and prints each broken seed on stderr as it is found.
  prfence-sim replay --seed S [--family F]     replays random run number S, with its timeline
  prfence-sim replay --scenario TEXT [--picks P]   replays a scenario and schedule (as printed)
  prfence-sim exhaustive --scenario TEXT [--limit N]
      every schedule of a (small) scenario, depth first
";

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The `--scenario` argument, read; a usage error (exit 2) when missing or unreadable.
fn scenario_arg(args: &[String]) -> Result<Scenario, ExitCode> {
    let Some(text) = arg(args, "--scenario") else {
        eprint!("{USAGE}");
        return Err(ExitCode::from(2));
    };
    text.parse().map_err(|e| {
        eprintln!("prfence-sim: {e}");
        ExitCode::from(2)
    })
}

fn parse_picks(text: &str) -> Vec<usize> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .expect("picks are numbers separated by commas")
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match args.first().map(String::as_str) {
        Some("run") => run(&args),
        Some("replay") => replay(&args),
        Some("exhaustive") => exhaustive(&args),
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Random run number `seed`, from one family when `family` is given (a family's name, or a
/// scenario's text form: random schedules of that one scenario).
fn seeded(seed: u64, family: Option<&str>) -> (Scenario, ScheduleRun) {
    match family {
        None => explore::random_run(seed),
        Some(text) if text.contains(' ') => {
            let scenario: Scenario = text.parse().expect("a scenario");
            let run = if seed.is_multiple_of(2) {
                explore::run(&scenario, &mut explore::Random::new(seed))
            } else {
                explore::run(&scenario, &mut explore::Pct::new(seed, 3, 60))
            };
            (scenario, run)
        }
        Some(f) => {
            let mut rng = Rng::new(seed);
            let scenario = Scenario::draw_family(f, &mut rng);
            let run = explore::run(&scenario, &mut explore::Random::new(rng.next_u64()));
            (scenario, run)
        }
    }
}

fn run(args: &[String]) -> ExitCode {
    let schedules: u64 = arg(args, "--schedules").map_or(100_000, |s| s.parse().unwrap());
    let first: u64 = arg(args, "--seed").map_or(1, |s| s.parse().unwrap());
    let jobs: u64 = arg(args, "--jobs").map_or_else(
        || std::thread::available_parallelism().map_or(2, |n| n.get() as u64),
        |s| s.parse().unwrap(),
    );
    let family = arg(args, "--family").or_else(|| arg(args, "--scenario"));
    // Count broken properties per family instead of stopping at the first.
    let keep_going = args.iter().any(|a| a == "--keep-going");
    let tally: Arc<Mutex<std::collections::BTreeMap<String, (u64, u64)>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(first));
    let stop = Arc::new(AtomicBool::new(false));
    let found: Arc<Mutex<Option<(u64, Scenario, ScheduleRun)>>> = Arc::new(Mutex::new(None));
    let totals = Arc::new(Mutex::new((0u64, 0u64, 0u64, 0u64, 0u64)));
    let started = Instant::now();
    let workers: Vec<_> = (0..jobs)
        .map(|worker| {
            let (next, stop, found, totals, family, tally) = (
                Arc::clone(&next),
                Arc::clone(&stop),
                Arc::clone(&found),
                Arc::clone(&totals),
                family.clone(),
                Arc::clone(&tally),
            );
            std::thread::spawn(move || {
                prfence_sim::sched::pin_to_one_cpu(usize::try_from(worker).unwrap_or(0));
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + schedules {
                        break;
                    }
                    let (scenario, result) = seeded(seed, family.as_deref());
                    {
                        let mut t = totals.lock().unwrap();
                        t.0 += 1;
                        t.1 += result.steps as u64;
                        t.2 += u64::from(result.unfinished);
                        t.3 += result.writes_admitted as u64;
                        t.4 += result.writes_refused as u64;
                        if t.0 % 10_000 == 0 {
                            eprintln!(
                                "{} schedules, {:.0}/s",
                                t.0,
                                t.0 as f64 / started.elapsed().as_secs_f64()
                            );
                        }
                    }
                    if keep_going {
                        let what = result
                            .violations
                            .first()
                            .map_or("", |v| v.property)
                            .to_owned();
                        let name = format!("{} {what}", scenario_family(&scenario));
                        if !what.is_empty() {
                            // Every broken seed, so each can be replayed, not only the first.
                            eprintln!("seed {seed} broke {name}");
                        }
                        let mut t = tally.lock().unwrap();
                        let entry = t.entry(name).or_insert((0, seed));
                        entry.0 += 1;
                    } else if result.failed() {
                        stop.store(true, Ordering::Relaxed);
                        found
                            .lock()
                            .unwrap()
                            .get_or_insert((seed, scenario, result));
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (runs, steps, unfinished, admitted, refused) = *totals.lock().unwrap();
    println!(
        "{runs} schedules in {elapsed:.1} s ({:.0}/s), {steps} steps, {unfinished} at the step \
         bound; writes admitted {admitted}, refused {refused}",
        runs as f64 / elapsed
    );
    if keep_going {
        println!("runs per family and first broken property (first seed):");
        for (name, (count, seed)) in tally.lock().unwrap().iter() {
            println!("  {name:<24} {count:>8}  (seed {seed})");
        }
        return ExitCode::SUCCESS;
    }
    let found = found.lock().unwrap().take();
    let Some((seed, scenario, result)) = found else {
        println!("no property broken");
        return ExitCode::SUCCESS;
    };
    println!("seed {seed} broke a property; shrinking…");
    let picks: Vec<usize> = result.picks.iter().map(|p| p.value).collect();
    let (scenario, picks, shrunk) = explore::shrink(&scenario, &picks, 400);
    println!("{}", explore::report(&scenario, &picks, &shrunk));
    ExitCode::FAILURE
}

/// A short name for the kind of scenario, for the tallies.
fn scenario_family(s: &Scenario) -> String {
    use prfence_sim::world::Op;
    let fences = s
        .actions
        .iter()
        .filter(|a| matches!(a.op, Op::Fence { .. }))
        .count();
    let refence = s.actions.iter().any(|a| matches!(a.op, Op::Refence { .. }));
    let pause = s
        .happenings
        .iter()
        .any(|(_, h)| matches!(h, prfence_sim::world::Happening::Pause { .. }));
    let lease = s.actions.iter().any(|a| matches!(a.op, Op::Lease));
    let kind = if !s.booting.is_empty() {
        "boot"
    } else if lease {
        "lease"
    } else if refence && s.quiet_after.is_some() {
        "rerun"
    } else if refence {
        "refence"
    } else if pause {
        "pause"
    } else if fences == s.actions.len() && s.nodes == 3 && fences == 2 {
        "ring"
    } else if fences == s.actions.len() && s.nodes == 2 && fences == 2 {
        "mutual"
    } else if fences == s.actions.len() {
        "crowd"
    } else {
        "churn"
    };
    format!("{kind}/{:?}", s.target).to_lowercase()
}

fn replay(args: &[String]) -> ExitCode {
    let (scenario, picks, result) = if let Some(seed) = arg(args, "--seed") {
        let family = arg(args, "--family").or_else(|| arg(args, "--scenario"));
        let (scenario, result) = seeded(seed.parse().unwrap(), family.as_deref());
        let picks = result.picks.iter().map(|p| p.value).collect();
        (scenario, picks, result)
    } else {
        let scenario = match scenario_arg(args) {
            Ok(scenario) => scenario,
            Err(code) => return code,
        };
        let picks = arg(args, "--picks").map_or_else(Vec::new, |p| parse_picks(&p));
        let result = explore::run(&scenario, &mut Replay::new(picks.clone()));
        (scenario, picks, result)
    };
    println!("{}", explore::report(&scenario, &picks, &result));
    if result.failed() {
        ExitCode::FAILURE
    } else {
        println!("no property broken ({} steps)", result.steps);
        ExitCode::SUCCESS
    }
}

fn exhaustive(args: &[String]) -> ExitCode {
    let scenario = match scenario_arg(args) {
        Ok(scenario) => scenario,
        Err(code) => return code,
    };
    let limit = arg(args, "--limit").map_or(10_000_000, |s| s.parse().unwrap());
    let started = Instant::now();
    let result = explore::exhaustive(&scenario, limit);
    println!(
        "{} schedules of `{scenario}` ({} more stopped early as covered) in {:.1} s{}",
        result.schedules,
        result.pruned,
        started.elapsed().as_secs_f64(),
        if result.complete {
            ": all of them"
        } else {
            " (stopped before the end)"
        }
    );
    match result.failure {
        None => ExitCode::SUCCESS,
        Some((picks, run)) => {
            println!("{}", explore::report(&scenario, &picks, &run));
            ExitCode::FAILURE
        }
    }
}
