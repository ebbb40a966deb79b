//! From samples to what a reader compares: medians of per-repetition ratios to the limit (each
//! repetition is the same stretch of time for every mode), a markdown report and SVG charts.
use std::{fmt::Write as _, path::Path};

use plotters::prelude::*;

use super::load::{Case, HEADLINE_MODES, Mode, Sample};

/// Median and range of a value over repetitions.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        } else {
            sorted[mid]
        };
        Self {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        }
    }
}

/// One mode in one case, summarised over the repetitions.
pub struct ModeSummary {
    pub mode: Mode,
    pub rate: f64,
    /// Connection rate over the limit's in the same repetition.
    pub ratio: Spread,
    /// Wall-clock time one connection takes more than in the limit, µs.
    pub extra_us: f64,
    pub cpu_us_per_conn: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// p99 latency over the limit's in the same repetition.
    pub p99_ratio: f64,
    /// The most conntrack entries left after a run.
    pub conntrack: u64,
}

/// A case's samples: `samples[i][r]` is mode `modes[i]` in repetition `r`; `modes[0]` is the
/// limit.
pub struct CaseResult {
    pub case: Case,
    pub modes: Vec<Mode>,
    pub samples: Vec<Vec<Sample>>,
}

impl CaseResult {
    pub fn summaries(&self) -> Vec<ModeSummary> {
        let limit = &self.samples[0];
        self.modes
            .iter()
            .zip(&self.samples)
            .map(|(&mode, samples)| {
                let per_rep = |f: &dyn Fn(&Sample, &Sample) -> f64| {
                    Spread::of(
                        &samples
                            .iter()
                            .zip(limit)
                            .map(|(s, l)| f(s, l))
                            .collect::<Vec<_>>(),
                    )
                };
                let med = |f: fn(&Sample) -> f64| {
                    Spread::of(&samples.iter().map(f).collect::<Vec<_>>()).median
                };
                ModeSummary {
                    mode,
                    rate: med(|s| s.rate),
                    ratio: per_rep(&|s, l| s.rate / l.rate),
                    extra_us: per_rep(&|s, l| 1e6 / s.rate - 1e6 / l.rate).median,
                    cpu_us_per_conn: med(|s| s.cpu_us_per_conn),
                    p50: med(|s| s.p50),
                    p99: med(|s| s.p99),
                    p999: med(|s| s.p999),
                    p99_ratio: per_rep(&|s, l| s.p99 / l.p99).median,
                    conntrack: samples.iter().map(|s| s.conntrack).max().unwrap_or(0),
                }
            })
            .collect()
    }

    pub fn summary(&self, mode: Mode) -> Option<ModeSummary> {
        self.summaries().into_iter().find(|s| s.mode == mode)
    }
}

/// The markdown table of a group of cases, one row per mode.
pub fn table(results: &[&CaseResult]) -> String {
    let mut out = String::from(
        "| # | case | mode | conn/s | vs limit (min-max) | +µs/conn | CPU µs/conn | p50 / p99 / p99.9 µs | p99 vs limit | conntrack |\n\
         |---|---|---|---:|---|---:|---:|---|---:|---:|\n",
    );
    for (index, result) in results.iter().enumerate() {
        for s in result.summaries() {
            let (ratio, extra, p99_ratio) = if s.mode == Mode::Limit {
                ("1".into(), "".into(), "".into())
            } else {
                (
                    format!(
                        "**{:.3}** ({:.3}-{:.3})",
                        s.ratio.median, s.ratio.min, s.ratio.max
                    ),
                    format!("{:+.2}", s.extra_us),
                    format!("{:.2}x", s.p99_ratio),
                )
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {ratio} | {extra} | {:.2} | {:.0} / {:.0} / {:.0} | {p99_ratio} | {} |",
                index + 1,
                result.case,
                s.mode.name(),
                s.rate,
                s.cpu_us_per_conn,
                s.p50,
                s.p99,
                s.p999,
                s.conntrack
            );
        }
    }
    out
}

/// In [`HEADLINE_MODES`] order: the programs doing nothing in light greys, eBPF in blues (the
/// older kernels' programs lighter), iptables in red and orange.
const COLORS: [RGBColor; HEADLINE_MODES.len()] = [
    RGBColor(120, 120, 120),
    RGBColor(210, 210, 210),
    RGBColor(165, 165, 165),
    RGBColor(31, 119, 180),
    RGBColor(128, 190, 225),
    RGBColor(70, 150, 200),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
];

fn color(mode: Mode) -> RGBColor {
    COLORS[HEADLINE_MODES.iter().position(|&m| m == mode).unwrap_or(0)]
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Bars of each intercepting mode's rate over the limit, with min-max whiskers, per case
/// (numbered as in the table).
pub fn ratio_chart(path: &Path, title: &str, results: &[&CaseResult]) -> anyhow::Result<()> {
    draw_ratio_chart(path, title, results)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}

fn draw_ratio_chart(path: &Path, title: &str, results: &[&CaseResult]) -> DrawResult {
    let width = 160 + 110 * results.len() as u32;
    let root = SVGBackend::new(path, (width.max(640), 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..results.len() as f64, 0.0..1.3)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        // Case numbers are drawn under their bars below: plotters picks its own tick places.
        .x_label_formatter(&|_| String::new())
        .x_desc("case (see the table)")
        .y_desc("connection rate / no interception")
        .draw()?;
    let intercepting: Vec<Mode> = HEADLINE_MODES
        .iter()
        .copied()
        .filter(|&m| m != Mode::Limit && results.iter().any(|r| r.modes.contains(&m)))
        .collect();
    let bar = 0.8 / intercepting.len() as f64;
    for (m, &mode) in intercepting.iter().enumerate() {
        let spreads: Vec<(usize, Spread)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.summary(mode)?.ratio)))
            .collect();
        let style = color(mode).filled();
        chart
            .draw_series(spreads.iter().map(|&(i, s)| {
                let x0 = i as f64 + 0.1 + m as f64 * bar;
                Rectangle::new([(x0, 0.0), (x0 + bar * 0.9, s.median)], style)
            }))?
            .label(mode.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], style));
        chart.draw_series(spreads.iter().map(|&(i, s)| {
            let x = i as f64 + 0.1 + (m as f64 + 0.45) * bar;
            PathElement::new(vec![(x, s.min), (x, s.max)], BLACK.stroke_width(1))
        }))?;
    }
    for i in 0..results.len() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            format!("#{}", i + 1),
            (x - 8, y + 6),
            ("sans-serif", 13),
        ))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (results.len() as f64, 1.0)],
        BLACK.mix(0.5).stroke_width(1),
    )))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A chart line: its mode (the colour), its label and its (x, ratio) points.
pub type SweepLine = (Mode, String, Vec<(f64, Spread)>);

/// One line per (mode, label) of the rate over the limit against a count on a log axis (ignored
/// ports, registered pods).
pub fn sweep_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    lines: &[SweepLine],
) -> anyhow::Result<()> {
    draw_sweep_chart(path, title, x_desc, lines)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}

fn draw_sweep_chart(path: &Path, title: &str, x_desc: &str, lines: &[SweepLine]) -> DrawResult {
    let x_max = lines
        .iter()
        .flat_map(|(_, _, points)| points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((0.8..x_max * 1.3).log_scale(), 0.0..1.3)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("connection rate / no interception")
        .draw()?;
    for (i, (mode, label, points)) in lines.iter().enumerate() {
        let color = color(*mode);
        let style = if i % 2 == 0 {
            color.stroke_width(2)
        } else {
            color.mix(0.6).stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, s)| (x, s.median)),
                style,
            ))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        chart.draw_series(points.iter().map(|&(x, s)| {
            PathElement::new(vec![(x, s.min), (x, s.max)], color.stroke_width(1))
        }))?;
        chart.draw_series(
            points
                .iter()
                .map(|&(x, s)| Circle::new((x, s.median), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle_or_the_mean_of_the_two_middles() {
        let odd = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((odd.median, odd.min, odd.max), (2.0, 1.0, 3.0));
        let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
    }

    fn sample(rate: f64, p99: f64) -> Sample {
        Sample {
            conns: rate,
            rate,
            cpu_us_per_conn: 1e6 / rate,
            p50: p99 / 2.0,
            p99,
            p999: p99 * 2.0,
            conntrack: 0,
        }
    }

    #[test]
    fn ratios_are_taken_within_each_repetition() {
        // The limit halves in the second repetition; eBPF is 0.9 of it in both.
        let result = CaseResult {
            case: crate::base_case(crate::load::Direction::Outbound, crate::load::Family::Ipv4),
            modes: vec![Mode::Limit, Mode::Ebpf],
            samples: vec![
                vec![sample(1000.0, 10.0), sample(500.0, 20.0)],
                vec![sample(900.0, 11.0), sample(450.0, 22.0)],
            ],
        };
        let ebpf = result.summary(Mode::Ebpf).unwrap();
        assert!((ebpf.ratio.median - 0.9).abs() < 1e-9);
        assert!((ebpf.ratio.min - 0.9).abs() < 1e-9 && (ebpf.ratio.max - 0.9).abs() < 1e-9);
        assert!((ebpf.p99_ratio - 1.1).abs() < 1e-9);
    }
}
