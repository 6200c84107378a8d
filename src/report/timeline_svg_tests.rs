//! Tests of the SVG timeline: series, labels, the peak's position, odd input.
use super::*;
use crate::analysis::timeline::{IterationMark, OomMark, PeakMark};

use crate::analysis::state::CATEGORIES;
/// Events per iteration in the synthetic timeline.
const ITER_LEN: u64 = 100;
const STEPS: u64 = 20;

/// Three training iterations of `ITER_LEN` events: parameters constant, inputs per
/// iteration, activations rising through the forward pass and falling in the backward
/// pass while gradients appear, optimizer state from the first step on. Iteration 1 has
/// the largest activations, so the peak is in it, at its forward/backward turn.
/// "workspace" and "other" stay zero.
fn synthetic() -> Timeline {
    let mut samples = Vec::new();
    let mut reserved = 0u64;
    for it in 0..3u64 {
        let act_unit = if it == 1 { 640 * MIB } else { 512 * MIB };
        for j in 0..STEPS {
            let event = it * ITER_LEN + j * (ITER_LEN / STEPS);
            let forward = j < STEPS / 2;
            let depth = if forward { j } else { STEPS - j };
            let mut by = vec![0u64; CATEGORIES.len()];
            let at = |name: &str| CATEGORIES.iter().position(|c| *c == name).unwrap();
            by[at("parameter")] = 2 * GIB;
            by[at("gradient")] = if forward {
                0
            } else {
                (j - STEPS / 2 + 1) * 100 * MIB
            };
            by[at("optimizer_state")] = if it > 0 { 4 * GIB } else { 0 };
            by[at("activation")] = depth * act_unit;
            by[at("temporary")] = if j % 3 == 1 { 256 * MIB } else { 0 };
            by[at("input")] = 64 * MIB;
            let allocated: u64 = by.iter().sum();
            // Reserved follows the high-water mark, rounded up to 2 MiB plus some slack.
            reserved = reserved.max(allocated.div_ceil(2 * MIB) * 2 * MIB + 300 * MIB);
            samples.push(Sample {
                event,
                by_category: by,
                reserved,
            });
        }
    }
    let top = samples
        .iter()
        .max_by_key(|s| s.allocated())
        .expect("samples are not empty");
    let peak = PeakMark {
        event: top.event,
        allocated: top.allocated(),
    };
    Timeline {
        title: "synthetic training loop".into(),
        categories: CATEGORIES.iter().map(|c| c.to_string()).collect(),
        samples,
        iterations: (0..3)
            .map(|k| IterationMark {
                label: format!("iter {k}"),
                event: k * ITER_LEN,
            })
            .collect(),
        peak: Some(peak),
        ooms: vec![],
        capacity: Some(16 * GIB),
    }
}

/// Checks that tags nest and close, and returns the names of the top-level elements:
/// enough XML to catch a truncated or mis-joined document.
fn check_well_formed(svg: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut top = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("unclosed tag") + open;
        let tag = &rest[open + 1..close];
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if let Some(closing) = tag.strip_prefix('/') {
            let expected = stack.pop().expect("closing tag without opening");
            assert_eq!(closing.trim(), expected, "mis-nested tags");
        } else if !tag.ends_with('/') {
            if stack.is_empty() {
                top.push(name.clone());
            }
            stack.push(name);
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    top
}

/// The contents of the first `<g ATTRS>` group (groups are never nested).
fn group<'a>(svg: &'a str, attrs: &str) -> Option<&'a str> {
    let open = format!("<g {attrs}>");
    let start = svg.find(&open)? + open.len();
    let end = svg[start..].find("</g>")? + start;
    Some(&svg[start..end])
}

/// Texts of the `<text>` elements in `svg`, trimmed.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            Some(body.trim().to_string())
        })
        .collect()
}

fn attr(element: &str, name: &str) -> Option<f64> {
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    let end = element[start..].find('"')? + start;
    element[start..end].parse().ok()
}

/// Every (x, y) of every `points="..."` list in `svg`.
fn points(svg: &str) -> Vec<(f64, f64)> {
    svg.split("points=\"")
        .skip(1)
        .flat_map(|p| {
            let list = &p[..p.find('"').unwrap_or(0)];
            list.split_whitespace()
                .filter_map(|xy| {
                    let (x, y) = xy.split_once(',')?;
                    Some((x.parse().ok()?, y.parse().ok()?))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Pixel x of an iteration's dashed line.
fn iteration_x(svg: &str, label: &str) -> f64 {
    let g = group(svg, &format!(r#"class="iteration" data-label="{label}""#))
        .unwrap_or_else(|| panic!("no group for {label}"));
    let xs: Vec<f64> = points(g).iter().map(|p| p.0).collect();
    assert!(!xs.is_empty(), "{label} has no line");
    assert!(
        xs.iter().all(|&x| x == xs[0]),
        "{label} line is not vertical"
    );
    xs[0]
}

#[test]
fn render_gives_one_well_formed_svg_document() {
    let svg = render(&synthetic());
    assert!(svg.starts_with("<svg "), "{}", &svg[..40]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(check_well_formed(&svg), ["svg"]);
    assert!(svg.contains(r#"width="1200" height="600""#));
    assert!(svg.contains("<title>synthetic training loop</title>"));
    assert!(texts(&svg).contains(&"synthetic training loop".to_string()));
}

#[test]
fn each_non_zero_category_has_an_area_and_a_legend_entry() {
    let t = synthetic();
    let svg = render(&t);
    let legend = texts(group(&svg, r#"id="legend""#).expect("legend group"));
    let mut fills = Vec::new();
    for name in [
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
        "temporary",
        "input",
    ] {
        let area = group(&svg, &format!(r#"class="area" data-series="{name}""#))
            .unwrap_or_else(|| panic!("no area for {name}"));
        assert!(area.contains("<polygon"), "{name}: {area}");
        let c = category_color(name);
        let fill = format!(r##"fill="#{:02X}{:02X}{:02X}""##, c.0, c.1, c.2);
        assert!(area.contains(&fill), "{name} is not drawn in its colour");
        fills.push(fill);
        assert!(legend.contains(&name.to_string()), "{name} not in legend");
    }
    fills.sort();
    fills.dedup();
    assert_eq!(fills.len(), 6, "categories share a colour");

    // The areas are stacked bottom first, in `categories` order: what persists (parameters,
    // optimizer state) below what comes and goes (activations, temporaries).
    let order: Vec<usize> = [
        "parameter",
        "optimizer_state",
        "gradient",
        "activation",
        "temporary",
    ]
    .iter()
    .map(|n| svg.find(&format!(r#"data-series="{n}""#)).expect("area"))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");

    let reserved = group(&svg, r#"class="line" data-series="reserved""#).expect("reserved");
    assert!(reserved.contains("<polyline"));
    assert_eq!(legend[0], "reserved");
}

#[test]
fn all_zero_categories_are_left_out() {
    let svg = render(&synthetic());
    // "workspace" and "other" hold no bytes in the synthetic timeline.
    for name in ["workspace", "other"] {
        assert!(!svg.contains(name), "{name} appears in the chart");
    }
}

#[test]
fn iteration_starts_are_dashed_lines_with_their_labels() {
    let svg = render(&synthetic());
    let all_texts = texts(&svg);
    let mut xs = Vec::new();
    for label in ["iter 0", "iter 1", "iter 2"] {
        let g = group(&svg, &format!(r#"class="iteration" data-label="{label}""#))
            .expect("iteration group");
        // A dashed line is drawn as several segments.
        assert!(g.matches("<polyline").count() > 5, "{label} is not dashed");
        assert!(
            all_texts.contains(&label.to_string()),
            "{label} not written"
        );
        xs.push(iteration_x(&svg, label));
    }
    // Equal event spacing gives equal pixel spacing.
    assert!(xs[0] < xs[1] && xs[1] < xs[2], "{xs:?}");
    assert!(((xs[1] - xs[0]) - (xs[2] - xs[1])).abs() <= 1.0, "{xs:?}");
}

#[test]
fn peak_is_labelled_with_its_formatted_size() {
    let t = synthetic();
    let peak = t.peak.clone().expect("synthetic has a peak");
    // 2 GiB parameters + 4 GiB optimizer state + 10 x 640 MiB activations + 100 MiB
    // gradients + 256 MiB temporary + 64 MiB input.
    assert_eq!(peak.allocated, 12964 * MIB);
    assert_eq!(peak.event, 150);
    let svg = render(&t);
    let g = group(&svg, r#"id="peak""#).expect("peak group");
    assert_eq!(texts(g), ["peak 12.66 GiB"]);
    assert_eq!(format_bytes(peak.allocated), "12.66 GiB");
}

#[test]
fn peak_marker_sits_at_the_peak_event_on_top_of_the_stack() {
    let t = synthetic();
    let svg = render(&t);
    let g = group(&svg, r#"id="peak""#).expect("peak group");
    let circle = &g[g.find("<circle").expect("peak marker")..];
    let (cx, cy) = (
        attr(circle, "cx").expect("cx"),
        attr(circle, "cy").expect("cy"),
    );

    // The peak is at event 150, half-way through iteration 1 (events 100..200).
    let (x1, x2) = (iteration_x(&svg, "iter 1"), iteration_x(&svg, "iter 2"));
    let expected = x1 + (x2 - x1) * 0.5;
    assert!(
        (cx - expected).abs() <= 1.5,
        "peak at x {cx}, expected {expected}"
    );

    // Its height is the top of the stack: the highest point (smallest y) of any area.
    let top = [
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
        "temporary",
        "input",
    ]
    .iter()
    .flat_map(|n| points(group(&svg, &format!(r#"class="area" data-series="{n}""#)).expect("area")))
    .map(|p| p.1)
    .fold(f64::INFINITY, f64::min);
    assert!(
        (cy - top).abs() <= 1.5,
        "peak at y {cy}, stack top at {top}"
    );
}

#[test]
fn y_axis_ticks_use_binary_units() {
    let svg = render(&synthetic());
    let axes = texts(group(&svg, r#"id="axes""#).expect("axes"));
    assert!(axes.contains(&"allocator events".to_string()));
    let gib: Vec<&String> = axes.iter().filter(|t| t.ends_with(" GiB")).collect();
    assert!(gib.len() >= 3, "few GiB ticks: {axes:?}");
    assert!(axes.contains(&"0 GiB".to_string()), "{axes:?}");
    // No raw byte counts on the axis.
    assert!(!axes
        .iter()
        .any(|t| t.len() > 9 && t.chars().all(|c| c.is_ascii_digit())));

    // Small timelines get a smaller unit.
    let mut t = synthetic();
    for s in &mut t.samples {
        for b in &mut s.by_category {
            *b /= 64;
        }
        s.reserved /= 64;
    }
    t.peak = None;
    t.capacity = None;
    let svg = render(&t);
    let axes = texts(group(&svg, r#"id="axes""#).expect("axes"));
    assert!(axes.iter().any(|t| t.ends_with(" MiB")), "{axes:?}");
    assert!(!axes.iter().any(|t| t.ends_with(" GiB")), "{axes:?}");
}

#[test]
fn capacity_is_drawn_only_when_near_the_data() {
    let mut t = synthetic();
    let svg = render(&t);
    let g = group(&svg, r#"id="capacity""#).expect("16 GiB capacity is drawn");
    assert_eq!(texts(g), ["capacity 16.00 GiB"]);
    assert!(texts(group(&svg, r#"id="legend""#).expect("legend")).contains(&"capacity".into()));

    // 80 GiB against ~13 GiB of data would squash the chart: no line, no legend entry.
    t.capacity = Some(80 * GIB);
    let svg = render(&t);
    assert!(group(&svg, r#"id="capacity""#).is_none());
    assert!(!svg.contains("capacity"));

    t.capacity = None;
    assert!(!render(&t).contains("capacity"));
}

#[test]
fn ooms_are_red_markers_with_the_requested_size() {
    let mut t = synthetic();
    assert!(group(&render(&t), r#"class="oom""#).is_none());
    t.ooms.push(OomMark {
        event: 250,
        requested: 3 * GIB,
    });
    let svg = render(&t);
    let g = group(&svg, r#"class="oom""#).expect("oom group");
    assert_eq!(texts(g), ["OOM: 3.00 GiB"]);
    assert!(g.contains(r##"stroke="#D62728""##), "marker is not red");
    // The marker is centred on event 250, half-way through iteration 2.
    let xs: Vec<f64> = points(g).iter().map(|p| p.0).collect();
    let centre = (xs.iter().cloned().fold(f64::INFINITY, f64::min)
        + xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
        / 2.0;
    let (x2, x1) = (iteration_x(&svg, "iter 2"), iteration_x(&svg, "iter 1"));
    let expected = x2 + (x2 - x1) * 0.5;
    assert!(
        (centre - expected).abs() <= 2.0,
        "oom at {centre}, expected {expected}"
    );
}

#[test]
fn empty_timeline_says_no_allocations_recorded() {
    let t = Timeline {
        title: "empty".into(),
        categories: CATEGORIES.iter().map(|c| c.to_string()).collect(),
        samples: vec![],
        iterations: vec![],
        peak: None,
        ooms: vec![],
        capacity: Some(80 * GIB),
    };
    let svg = render(&t);
    assert_eq!(check_well_formed(&svg), ["svg"]);
    assert!(texts(&svg).contains(&"no allocations recorded".to_string()));
    assert!(svg.contains("<title>empty</title>"));
}

#[test]
fn odd_input_renders_without_panicking() {
    let base = synthetic();
    let variants: Vec<Timeline> = vec![
        // One sample, no marks at all.
        Timeline {
            samples: vec![base.samples[3].clone()],
            iterations: vec![],
            peak: None,
            capacity: None,
            ..base.clone()
        },
        // Every sample at the same event, all zero bytes.
        Timeline {
            samples: vec![
                Sample {
                    event: 7,
                    by_category: vec![0; 8],
                    reserved: 0,
                };
                3
            ],
            peak: None,
            ..base.clone()
        },
        // `by_category` shorter and longer than `categories`, markers past the samples.
        Timeline {
            samples: vec![
                Sample {
                    event: 0,
                    by_category: vec![GIB],
                    reserved: 2 * GIB,
                },
                Sample {
                    event: 10,
                    by_category: vec![GIB; 12],
                    reserved: 16 * GIB,
                },
            ],
            ooms: vec![OomMark {
                event: 1_000_000,
                requested: u64::MAX,
            }],
            title: "<a & \"b\">".into(),
            ..base.clone()
        },
    ];
    let mut variants = variants;
    // Byte counts whose sum overflows u64.
    variants.push(Timeline {
        samples: vec![Sample {
            event: 1,
            by_category: vec![u64::MAX; 3],
            reserved: u64::MAX,
        }],
        peak: None,
        ..base.clone()
    });
    for t in &variants {
        let svg = render(t);
        assert_eq!(check_well_formed(&svg), ["svg"], "{svg}");
    }
    let svg = render(&variants[2]);
    assert!(svg.contains("&lt;a &amp; &quot;b&quot;&gt;"));
}

#[test]
fn crowded_iteration_labels_do_not_overlap() {
    let mut t = synthetic();
    t.iterations = (0..60)
        .map(|k| IterationMark {
            label: format!("iter {k}"),
            event: k * 5,
        })
        .collect();
    let svg = render(&t);
    // Every iteration keeps its line; labels are written only where they fit.
    let mut labelled = Vec::new();
    for k in 0..60 {
        let label = format!("iter {k}");
        let g = group(&svg, &format!(r#"class="iteration" data-label="{label}""#))
            .expect("iteration group");
        if let Some(i) = g.find("<text") {
            labelled.push((
                attr(&g[i..], "x").expect("x"),
                text_width(&label, LABEL_SIZE),
            ));
        }
    }
    assert!(
        labelled.len() >= 3 && labelled.len() < 60,
        "{}",
        labelled.len()
    );
    for w in labelled.windows(2) {
        assert!(w[0].0 + w[0].1 as f64 <= w[1].0, "labels overlap: {w:?}");
    }
}

#[test]
fn units_and_labels() {
    assert_eq!(Unit::for_max(13.0 * GIB as f64).name, "GiB");
    assert_eq!(Unit::for_max(900.0 * MIB as f64).name, "MiB");
    assert_eq!(Unit::for_max(1.0).name, "B");
    assert_eq!(Unit::for_max(0.0).name, "B");
    let gib = Unit::for_max(GIB as f64);
    assert_eq!(gib.tick_label(0.0), "0 GiB");
    assert_eq!(gib.tick_label(2.5), "2.5 GiB");
    assert_eq!(gib.tick_label(10.0), "10 GiB");
    assert_eq!(gib.tick_label(0.126), "0.13 GiB");
    assert_eq!(group_thousands(0), "0");
    assert_eq!(group_thousands(999), "999");
    assert_eq!(group_thousands(1_234_567), "1,234,567");
    assert_eq!(shorten("abcdef", 4), "abc…");
    assert_eq!(shorten("abc", 4), "abc");
}

/// Writes the synthetic chart for a look in a browser:
/// `cargo test --lib timeline_svg -- --ignored` then `scripts/check-timeline-svg.sh`.
#[test]
#[ignore]
fn write_synthetic_svg_for_visual_check() {
    let write = |name: &str, t: &Timeline| {
        std::fs::write(format!("/tmp/{name}.svg"), render(t)).expect("write to /tmp");
    };
    let mut t = synthetic();
    write("timeline_test", &t);

    t.ooms.push(OomMark {
        event: 250,
        requested: 3 * GIB,
    });
    t.capacity = Some(13 * GIB);
    write("timeline_test_oom", &t);

    // Long traces: millions of events, many iterations, a long title, MiB scale.
    let mut t = synthetic();
    t.title = "a rather long workload name: llama-7b fine-tune, batch 8, seq 4096, bf16, \
               activation checkpointing off"
        .into();
    for s in &mut t.samples {
        s.event *= 40_000;
        s.by_category.iter_mut().for_each(|b| *b /= 40);
        s.reserved /= 40;
    }
    t.iterations = (0..60)
        .map(|k| IterationMark {
            label: format!("iter {k}"),
            event: k * 200_000,
        })
        .collect();
    t.peak = t.peak.map(|p| PeakMark {
        event: p.event * 40_000,
        allocated: p.allocated / 40,
    });
    t.capacity = None;
    write("timeline_test_long", &t);

    t.samples.clear();
    write("timeline_test_empty", &t);
}
