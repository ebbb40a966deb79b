//! Which cases the modes are compared in (the per-connection matrix and the ignored-ports sweep),
//! and one case measured with every mode interleaved.
use interceptor_tests::PodFixture;

use super::{
    Args, Settings, base_case,
    lab::Lab,
    load::{self, Case, Close, Direction, HEADLINE_MODES, MODES, Mode},
    report::CaseResult,
};

pub const DIRECTIONS: [Direction; 2] = [Direction::Outbound, Direction::Inbound];
const IGNORED_PORTS: [usize; 4] = [1, 15, 200, 3000];

/// The per-connection matrix: the headline cases with --quick; else both directions × RST/FIN
/// close × 1/2 workers × pinned/unpinned.
pub fn per_connection_cases(args: &Args) -> Vec<Case> {
    if args.pods_only {
        return Vec::new();
    }
    if args.quick {
        return DIRECTIONS.map(|d| base_case(d, args.family)).to_vec();
    }
    let mut cases = Vec::new();
    for direction in DIRECTIONS {
        for close in [Close::Rst, Close::Fin] {
            for workers in [1, 2] {
                for pinned in [true, false] {
                    cases.push(Case {
                        workers,
                        pinned,
                        close,
                        ..base_case(direction, args.family)
                    });
                }
            }
        }
    }
    cases
}

/// The ignored-ports sweep: 3,000 ports outbound with --quick; else 1, 15, 200 and 3,000 each
/// way.
pub fn ignored_port_cases(args: &Args) -> Vec<Case> {
    if args.pods_only {
        return Vec::new();
    }
    if args.quick {
        return vec![Case {
            ignored_ports: 3000,
            ..base_case(Direction::Outbound, args.family)
        }];
    }
    DIRECTIONS
        .iter()
        .flat_map(|&d| {
            IGNORED_PORTS.iter().map(move |&n| Case {
                ignored_ports: n,
                ..base_case(d, args.family)
            })
        })
        .collect()
}

/// Whether `case` is one of the one-worker cases (pinned or not, RST or FIN close, no ignored
/// ports), which every program variant must pass: the per-variant target is about them.
pub fn is_one_worker(case: &Case) -> bool {
    case.workers == 1 && case.ignored_ports == 0
}

/// The modes `case` compares: in the one-worker cases, the eBPF programs of older kernels and
/// the programs doing nothing (the floor) too.
pub fn modes(case: &Case) -> &'static [Mode] {
    if is_one_worker(case) {
        &HEADLINE_MODES
    } else {
        &MODES
    }
}

/// How many times `--repetitions` the one-worker cases get (see [`run_cases`]).
pub const ONE_WORKER_REPETITIONS: usize = 3;

/// `cases` one after the other, the one-worker ones (every target's cases) with three times the
/// repetitions: a median of seven samples of a case moves by a few percent from run to run, and
/// the per-variant target takes the lowest of sixteen such medians. Runs before 2026-11-26
/// 14:30 UTC gave three times the repetitions to the two headline cases only.
pub fn run_cases(
    lab: &mut Lab,
    cases: &[Case],
    settings: &Settings,
) -> anyhow::Result<Vec<CaseResult>> {
    cases
        .iter()
        .map(|case| {
            let repetitions = settings.repetitions
                * if is_one_worker(case) {
                    ONE_WORKER_REPETITIONS
                } else {
                    1
                };
            run_case(lab, case, repetitions, settings.seconds)
        })
        .collect()
}

/// The case's modes (see [`modes`]) interleaved in slices for `repetitions` × `seconds` each,
/// grouped into `repetitions` samples.
fn run_case(
    lab: &mut Lab,
    case: &Case,
    repetitions: usize,
    seconds: f64,
) -> anyhow::Result<CaseResult> {
    let modes = modes(case);
    for &mode in modes {
        lab.pod(mode, case.ignored_ports)?;
    }
    let pods: Vec<(Mode, &PodFixture)> = modes
        .iter()
        .map(|&mode| (mode, &lab.existing_pod(mode, case.ignored_ports).pod))
        .collect();
    let samples = load::measure_interleaved(
        &lab.connload,
        &pods,
        &lab.client_cgroup.path,
        case,
        repetitions as f64 * seconds * modes.len() as f64,
        repetitions,
    )?;
    let result = CaseResult {
        case: *case,
        modes: modes.to_vec(),
        samples,
    };
    let line = result
        .summaries()
        .iter()
        .skip(1)
        .map(|s| format!("{} {:.3}", s.mode.name(), s.ratio.median))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "{case}: {:.0} conn/s with no interception; {line}",
        result.summaries()[0].rate
    );
    Ok(result)
}
