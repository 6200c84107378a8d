//! The self-test's checks of `kernels/nn.cu` (embedding, nll_loss), `kernels/reduce.cu`,
//! `kernels/optim.cu` (Adam, AdamW, SGD with momentum) and `masked_fill`: each against the
//! engine on the cpu device, forward and backward, on random inputs.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{
    backprop, check, check_tol, cpu, random, read, tensor, Check, Cpu, Gpu, Strided, F32_UNIT, TOL,
};
use crate::engine::layout::Layout;
use crate::engine::op::{Cmp, Fill, Hyper, Op, OptimKind};
use crate::engine::optim::Optimizer;
use crate::engine::{Category, DType, TensorId};

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn cuda(x: impl std::fmt::Debug) -> String {
    format!("{x:?}")
}

/// An int64 (or bool) tensor on the cpu device holding `v`.
fn ints(d: &mut Cpu, shape: &[usize], dtype: DType, v: &[i64]) -> Result<TensorId, String> {
    let t = d
        .factory_fill(shape, dtype, false, Category::Input, Fill::Empty)
        .map_err(e)?;
    let vals: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    d.write(t, &vals).map_err(e)?;
    Ok(t)
}

/// Pseudo-random integers in `0..n`.
fn indices(count: usize, seed: u64, n: usize) -> Vec<i64> {
    random(count, seed, 0.0, 1.0)
        .iter()
        .map(|&u| ((u * n as f32) as i64).clamp(0, n as i64 - 1))
        .collect()
}

impl Gpu {
    fn up_i64(&self, v: &[i64]) -> Result<CudaSlice<i64>, String> {
        self.stream.clone_htod(v).map_err(cuda)
    }

    fn up_u8(&self, v: &[u8]) -> Result<CudaSlice<u8>, String> {
        self.stream.clone_htod(v).map_err(cuda)
    }

    fn one_block() -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

pub(super) fn checks(g: &Gpu, out: &mut Vec<Check>) -> Result<(), String> {
    embedding(g, out)?;
    nll_loss(g, out)?;
    masked_fill(g, out)?;
    dropout(g, out)?;
    cat(g, out)?;
    compare_where(g, out)?;
    reduce(g, out)?;
    optimizers(g, out)
}

fn embedding(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (vocab, dim, n) = (64usize, 96usize, 300usize);
    let tv = random(vocab * dim, 601, -2.0, 2.0);
    let iv = indices(n, 602, vocab);
    let rv = random(n * dim, 603, -1.0, 1.0);
    let mut d = cpu();
    let table = tensor(&mut d, &[vocab, dim], &tv, true)?;
    let idx = ints(&mut d, &[n], DType::I64, &iv)?;
    let y = d.embedding(idx, table).map_err(e)?;
    let want = read(&d, y)?;
    let (is, ts) = (g.up_i64(&iv)?, g.up(&tv)?);
    let mut o = g.out(n * dim)?;
    let f = g.function("embedding")?;
    let (nn, dd) = (n as i64, dim as i64);
    // SAFETY: `is` holds n indices below vocab, `ts` vocab x dim floats, `o` n x dim
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&is)
            .arg(&nn)
            .arg(&ts)
            .arg(&dd)
            .arg(&mut o)
            .launch(Gpu::cfg(n * dim))
    }
    .map_err(cuda)?;
    let case = format!("{n} lookups in a {vocab} x {dim} table");
    checks.push(check("embedding", case.clone(), &g.down(&o)?, &want));
    backprop(&mut d, y, &rv)?;
    let gt = d.grad(table).ok_or("no gradient on the cpu device")?;
    let want = read(&d, gt)?;
    let rs = g.up(&rv)?;
    let mut o = g.out(vocab * dim)?;
    let f = g.function("embedding_backward")?;
    // SAFETY: `rs` holds n x dim floats, `o` vocab x dim (zeroed)
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&is)
            .arg(&nn)
            .arg(&rs)
            .arg(&dd)
            .arg(&mut o)
            .launch(Gpu::cfg(n * dim))
    }
    .map_err(cuda)?;
    // a row used k times sums k gradients, in whatever order the atomics ran
    let most = (0..vocab)
        .map(|v| iv.iter().filter(|&&i| i == v as i64).count())
        .max()
        .unwrap_or(1);
    checks.push(check_tol(
        "embedding_backward",
        format!("{case}, indices repeating up to {most} times"),
        &g.down(&o)?,
        &want,
        (most as f64 * F32_UNIT * 4.0).max(TOL),
    ));
    Ok(())
}

fn nll_loss(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (rows, cols) = (96usize, 257usize);
    let lv = random(rows * cols, 701, -6.0, -0.05);
    // every seventh target is ignore_index
    let tv: Vec<i64> = indices(rows, 702, cols)
        .into_iter()
        .enumerate()
        .map(|(i, t)| if i % 7 == 3 { -100 } else { t })
        .collect();
    let mut d = cpu();
    let lp = tensor(&mut d, &[rows, cols], &lv, true)?;
    let t = ints(&mut d, &[rows], DType::I64, &tv)?;
    let loss = d.simple(Op::NllLoss, &[lp, t]).map_err(e)?;
    let want = read(&d, loss)?;
    let (ls, ts) = (g.up(&lv)?, g.up_i64(&tv)?);
    let (mut o, mut w) = (g.out(1)?, g.out(1)?);
    let f = g.function("nll_loss")?;
    let (rr, cc) = (rows as i64, cols as i64);
    // SAFETY: `ls` holds rows x cols floats, `ts` rows targets below cols (or -100)
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&ls)
            .arg(&ts)
            .arg(&rr)
            .arg(&cc)
            .arg(&mut o)
            .arg(&mut w)
            .launch(Gpu::one_block())
    }
    .map_err(cuda)?;
    let case = format!("mean over {rows} rows of {cols} classes, every 7th target ignored");
    checks.push(check_tol(
        "nll_loss",
        case.clone(),
        &g.down(&o)?,
        &want,
        (rows as f64 * F32_UNIT).max(TOL),
    ));
    let rv = random(1, 703, 0.5, 2.0);
    backprop(&mut d, loss, &rv)?;
    let gl = d.grad(lp).ok_or("no gradient on the cpu device")?;
    let want = read(&d, gl)?;
    let rs = g.up(&rv)?;
    let mut o = g.out(rows * cols)?;
    let f = g.function("nll_loss_backward")?;
    // SAFETY: `rs` and `w` hold one float, `o` rows x cols
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&rs)
            .arg(&ts)
            .arg(&w)
            .arg(&rr)
            .arg(&cc)
            .arg(&mut o)
            .launch(Gpu::cfg(rows * cols))
    }
    .map_err(cuda)?;
    checks.push(check("nll_loss_backward", case, &g.down(&o)?, &want));
    Ok(())
}

fn masked_fill(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (rows, cols) = (96usize, 257usize);
    let n = rows * cols;
    let xv = random(n, 801, -3.0, 3.0);
    let mv: Vec<i64> = indices(cols, 802, 2);
    let rv = random(n, 803, -1.0, 1.0);
    let mut d = cpu();
    let x = tensor(&mut d, &[rows, cols], &xv, true)?;
    let mask = ints(&mut d, &[cols], DType::Bool, &mv)?;
    let y = d.masked_fill(x, mask, -1.5).map_err(e)?;
    let want = read(&d, y)?;
    let xl = Layout::contiguous(&[rows, cols]);
    let mut ml = Layout::contiguous(&[1, cols]);
    ml.shape = smallvec::smallvec![rows, cols];
    ml.strides = smallvec::smallvec![0, 1];
    let bytes: Vec<u8> = mv.iter().map(|&m| m as u8).collect();
    let (xs, ms) = (g.up(&xv)?, g.up_u8(&bytes)?);
    let (sx, sm, nn) = (Strided::of(&xl), Strided::of(&ml), n as i64);
    let f = g.function("masked_fill")?;
    let run = |src: &CudaSlice<f32>, value: f32| -> Result<Vec<f32>, String> {
        let mut o = g.out(n)?;
        // SAFETY: `src` and `o` hold n floats, `ms` cols bytes read through stride-0 rows
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(src)
                .arg(&sx)
                .arg(&ms)
                .arg(&sm)
                .arg(&value)
                .arg(&mut o)
                .arg(&nn)
                .launch(Gpu::cfg(n))
        }
        .map_err(cuda)?;
        g.down(&o)
    };
    let case = "a broadcast row mask".to_string();
    checks.push(check("masked_fill", case.clone(), &run(&xs, -1.5)?, &want));
    backprop(&mut d, y, &rv)?;
    let gx = d.grad(x).ok_or("no gradient on the cpu device")?;
    let want = read(&d, gx)?;
    let rs = g.up(&rv)?;
    checks.push(check(
        "masked_fill",
        format!("{case}, backward (the gradient filled with 0)"),
        &run(&rs, 0.0)?,
        &want,
    ));
    Ok(())
}

fn dropout(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (rows, cols) = (96usize, 257usize);
    let n = rows * cols;
    let p = 0.3;
    let xv = random(n, 851, -3.0, 3.0);
    let rv = random(n, 852, -1.0, 1.0);
    let mut d = cpu();
    let x = tensor(&mut d, &[rows, cols], &xv, true)?;
    // the seed the engine gives this draw (draws are numbered in the run)
    let seed = d.draws + 1;
    let y = d.dropout(x, p).map_err(e)?;
    let want = read(&d, y)?;
    let xs = g.up(&xv)?;
    let mut o = g.out(n)?;
    let mut mask: CudaSlice<u8> = g.stream.alloc_zeros(n).map_err(cuda)?;
    let f = g.function("dropout")?;
    let keep_from = (p * (1u64 << 24) as f64).ceil() as u64;
    let (nn, scale) = (n as i64, (1.0 / (1.0 - p)) as f32);
    // SAFETY: `xs` and `o` hold n floats, `mask` n bytes
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&xs)
            .arg(&mut o)
            .arg(&mut mask)
            .arg(&nn)
            .arg(&seed)
            .arg(&keep_from)
            .arg(&scale)
            .launch(Gpu::cfg(n))
    }
    .map_err(cuda)?;
    let got = g.down(&o)?;
    let kept = got.iter().filter(|&&v| v != 0.0).count();
    let case = format!("p = {p} over {n} (kept {kept}, the same elements as the CPU's stream)");
    checks.push(check("dropout", case, &got, &want));
    backprop(&mut d, y, &rv)?;
    let gx = d.grad(x).ok_or("no gradient on the cpu device")?;
    let want = read(&d, gx)?;
    let rs = g.up(&rv)?;
    let mut o = g.out(n)?;
    let f = g.function("dropout_backward")?;
    // SAFETY: `rs` and `o` hold n floats, `mask` n bytes
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&rs)
            .arg(&mask)
            .arg(&mut o)
            .arg(&nn)
            .arg(&scale)
            .launch(Gpu::cfg(n))
    }
    .map_err(cuda)?;
    checks.push(check(
        "dropout_backward",
        format!("p = {p}, through the kept mask"),
        &g.down(&o)?,
        &want,
    ));
    Ok(())
}

fn cat(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let rows = 96usize;
    let widths = [50usize, 100, 107];
    let cols: usize = widths.iter().sum();
    let n = rows * cols;
    let mut d = cpu();
    let mut parts = Vec::new();
    let mut values = Vec::new();
    for (k, &w) in widths.iter().enumerate() {
        let v = random(rows * w, 1401 + k as u64, -2.0, 2.0);
        parts.push(tensor(&mut d, &[rows, w], &v, true)?);
        values.push(v);
    }
    let y = d.apply(&Op::Cat { dim: 1 }, &parts).map_err(e)?;
    let want = read(&d, y)?;
    let rv = random(n, 1404, -1.0, 1.0);
    backprop(&mut d, y, &rv)?;
    // each part's slice of the [rows, cols] output: the output's strides, offset by its start
    let slice = |start: usize, w: usize| Layout {
        shape: smallvec::smallvec![rows, w],
        strides: smallvec::smallvec![cols, 1],
        offset: start,
    };
    let mut o = g.out(n)?;
    let f = g.function("cat")?;
    let back = g.function("split")?;
    let rs = g.up(&rv)?;
    let mut start = 0;
    let mut grads = Vec::new();
    for (k, &w) in widths.iter().enumerate() {
        let xs = g.up(&values[k])?;
        let (sx, so, m) = (
            Strided::of(&Layout::contiguous(&[rows, w])),
            Strided::of(&slice(start, w)),
            (rows * w) as i64,
        );
        // SAFETY: `xs` holds the part's rows x w floats; its slice lies inside `o`'s n
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&xs)
                .arg(&sx)
                .arg(&mut o)
                .arg(&so)
                .arg(&m)
                .launch(Gpu::cfg(rows * w))
        }
        .map_err(cuda)?;
        // backward: the gradient's slice into the part
        let mut gp = g.out(rows * w)?;
        // SAFETY: the slice lies inside `rs`'s n floats; `gp` holds rows x w
        unsafe {
            g.stream
                .launch_builder(&back)
                .arg(&rs)
                .arg(&so)
                .arg(&mut gp)
                .arg(&sx)
                .arg(&m)
                .launch(Gpu::cfg(rows * w))
        }
        .map_err(cuda)?;
        grads.push(gp);
        start += w;
    }
    let case = format!("3 parts of {widths:?} columns along dim 1");
    checks.push(check("cat", case.clone(), &g.down(&o)?, &want));
    let mut got = Vec::new();
    let mut want = Vec::new();
    for (k, gp) in grads.iter().enumerate() {
        got.extend(g.down(gp)?);
        let gt = d.grad(parts[k]).ok_or("no gradient on the cpu device")?;
        want.extend(read(&d, gt)?);
    }
    checks.push(check("split", format!("{case}, backward"), &got, &want));
    Ok(())
}

fn compare_where(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (rows, cols) = (96usize, 257usize);
    let n = rows * cols;
    // halves, so that equal pairs occur
    let half = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| (x * 2.0).round() / 2.0).collect() };
    let av = half(random(n, 1501, -2.0, 2.0));
    let bv = half(random(cols, 1502, -2.0, 2.0));
    let full = Strided::of(&Layout::contiguous(&[rows, cols]));
    let mut row = Layout::contiguous(&[1, cols]);
    row.shape = smallvec::smallvec![rows, cols];
    row.strides = smallvec::smallvec![0, 1];
    let row = Strided::of(&row);
    let (asl, bsl) = (g.up(&av)?, g.up(&bv)?);
    let f = g.function("compare")?;
    let nn = n as i64;
    for (code, cmp) in [Cmp::Le, Cmp::Lt, Cmp::Ge, Cmp::Gt, Cmp::Eq, Cmp::Ne]
        .into_iter()
        .enumerate()
    {
        let mut d = cpu();
        let a = tensor(&mut d, &[rows, cols], &av, false)?;
        let b = tensor(&mut d, &[1, cols], &bv, false)?;
        let y = d
            .apply(&Op::Compare { cmp, scalar: None }, &[a, b])
            .map_err(e)?;
        let want = read(&d, y)?;
        let mut o: CudaSlice<u8> = g.stream.alloc_zeros(n).map_err(cuda)?;
        let c = code as i32;
        // SAFETY: `asl` holds n floats, `bsl` cols (read through stride-0 rows), `o` n bytes
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&c)
                .arg(&asl)
                .arg(&full)
                .arg(&bsl)
                .arg(&row)
                .arg(&mut o)
                .arg(&nn)
                .launch(Gpu::cfg(n))
        }
        .map_err(cuda)?;
        let got: Vec<f32> = g
            .stream
            .clone_dtoh(&o)
            .map_err(cuda)?
            .into_iter()
            .map(f32::from)
            .collect();
        let held = got.iter().filter(|&&v| v != 0.0).count();
        checks.push(check(
            "compare",
            format!("{} with a broadcast row ({held} of {n} hold)", cmp.name()),
            &got,
            &want,
        ));
    }
    // where(c, x, y) and the gradients of x and y
    let cv: Vec<i64> = indices(n, 1503, 2);
    let xv = random(n, 1504, -3.0, 3.0);
    let yv = random(n, 1505, -3.0, 3.0);
    let rv = random(n, 1506, -1.0, 1.0);
    let mut d = cpu();
    let c = ints(&mut d, &[rows, cols], DType::Bool, &cv)?;
    let x = tensor(&mut d, &[rows, cols], &xv, true)?;
    let y = tensor(&mut d, &[rows, cols], &yv, true)?;
    let w = d.apply(&Op::Where, &[c, x, y]).map_err(e)?;
    let want = read(&d, w)?;
    let bytes: Vec<u8> = cv.iter().map(|&v| v as u8).collect();
    let (cs, xs, ys) = (g.up_u8(&bytes)?, g.up(&xv)?, g.up(&yv)?);
    let mut o = g.out(n)?;
    let f = g.function("where")?;
    // SAFETY: every buffer holds n elements
    unsafe {
        g.stream
            .launch_builder(&f)
            .arg(&cs)
            .arg(&full)
            .arg(&xs)
            .arg(&full)
            .arg(&ys)
            .arg(&full)
            .arg(&mut o)
            .arg(&nn)
            .launch(Gpu::cfg(n))
    }
    .map_err(cuda)?;
    checks.push(check(
        "where",
        "a random condition".into(),
        &g.down(&o)?,
        &want,
    ));
    backprop(&mut d, w, &rv)?;
    let rs = g.up(&rv)?;
    let f = g.function("where_backward")?;
    for (input, leaf) in [(1i32, x), (2, y)] {
        let gt = d.grad(leaf).ok_or("no gradient on the cpu device")?;
        let want = read(&d, gt)?;
        let mut o = g.out(n)?;
        // SAFETY: every buffer holds n elements
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&input)
                .arg(&cs)
                .arg(&full)
                .arg(&rs)
                .arg(&mut o)
                .arg(&nn)
                .launch(Gpu::cfg(n))
        }
        .map_err(cuda)?;
        let which = if input == 1 { "x" } else { "y" };
        checks.push(check(
            "where_backward",
            format!("the gradient of {which}"),
            &g.down(&o)?,
            &want,
        ));
    }
    Ok(())
}

fn reduce(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let shape = [8usize, 33, 97];
    let n: usize = shape.iter().product();
    let xv = random(n, 901, -1.0, 1.0);
    let xs = g.up(&xv)?;
    let f = g.function("reduce")?;
    for (mean, dim) in [
        (false, Some(1)),
        (true, Some(1)),
        (false, Some(0)),
        (true, Some(2)),
        (false, None),
    ] {
        let mut d = cpu();
        let x = tensor(&mut d, &shape, &xv, false)?;
        let y = d.reduce(mean, x, dim, false).map_err(e)?;
        let want = read(&d, y)?;
        let (outer, len, inner) = match dim {
            Some(k) => (
                shape[..k as usize].iter().product::<usize>(),
                shape[k as usize],
                shape[k as usize + 1..].iter().product::<usize>(),
            ),
            None => (1, n, 1),
        };
        let mut o = g.out(outer * inner)?;
        let (m, a, l, b) = (mean as i32, outer as i64, len as i64, inner as i64);
        // SAFETY: `xs` holds outer x len x inner floats, `o` outer x inner
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&m)
                .arg(&xs)
                .arg(&a)
                .arg(&l)
                .arg(&b)
                .arg(&mut o)
                .launch(Gpu::cfg(outer * inner))
        }
        .map_err(cuda)?;
        let what = if mean { "mean" } else { "sum" };
        let case = match dim {
            Some(k) => format!("{what} over dim {k} of [8, 33, 97]"),
            None => format!("{what} of all {n}"),
        };
        checks.push(check_tol(
            "reduce",
            case,
            &g.down(&o)?,
            &want,
            (len as f64 * F32_UNIT).max(TOL),
        ));
    }
    Ok(())
}

fn optimizers(g: &Gpu, checks: &mut Vec<Check>) -> Result<(), String> {
    let (rows, cols) = (96usize, 257usize);
    let n = rows * cols;
    for (k, kind) in [OptimKind::Adam, OptimKind::AdamW, OptimKind::SgdMomentum]
        .into_iter()
        .enumerate()
    {
        let pv = random(n, 1001 + k as u64, -2.0, 2.0);
        let gv = random(n, 1101 + k as u64, -1.0, 1.0);
        let hyper = Hyper {
            lr: 1e-2,
            momentum: 0.9,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let mut d = cpu();
        let p = tensor(&mut d, &[rows, cols], &pv, true)?;
        // p's gradient is then gv
        backprop(&mut d, p, &gv)?;
        let mut opt = Optimizer::with_hyper(kind, vec![d.retain(p)], true, hyper);
        let steps = 2;
        for _ in 0..steps {
            opt.step(&mut d).map_err(e)?;
        }
        let want = read(&d, p)?;
        let (mut ps, gs) = (g.up(&pv)?, g.up(&gv)?);
        let (mut ms, mut vs) = (g.out(n)?, g.out(n)?);
        let nn = n as i64;
        let (lr, wd) = (hyper.lr as f32, hyper.weight_decay as f32);
        for t in 1..=steps {
            if kind == OptimKind::SgdMomentum {
                let f = g.function("sgd_step")?;
                let (mom, first) = (hyper.momentum as f32, (t == 1) as i32);
                // SAFETY: every buffer holds n floats
                unsafe {
                    g.stream
                        .launch_builder(&f)
                        .arg(&mut ps)
                        .arg(&gs)
                        .arg(&mut ms)
                        .arg(&nn)
                        .arg(&lr)
                        .arg(&mom)
                        .arg(&wd)
                        .arg(&first)
                        .launch(Gpu::cfg(n))
                }
                .map_err(cuda)?;
            } else {
                let f = g.function("adam_step")?;
                let (b1, b2) = (hyper.betas.0 as f32, hyper.betas.1 as f32);
                let eps = hyper.eps as f32;
                let bc1 = (1.0 - hyper.betas.0.powi(t)) as f32;
                let bc2 = (1.0 - hyper.betas.1.powi(t)) as f32;
                let adamw = (kind == OptimKind::AdamW) as i32;
                // SAFETY: every buffer holds n floats
                unsafe {
                    g.stream
                        .launch_builder(&f)
                        .arg(&mut ps)
                        .arg(&gs)
                        .arg(&mut ms)
                        .arg(&mut vs)
                        .arg(&nn)
                        .arg(&lr)
                        .arg(&b1)
                        .arg(&b2)
                        .arg(&eps)
                        .arg(&wd)
                        .arg(&bc1)
                        .arg(&bc2)
                        .arg(&adamw)
                        .launch(Gpu::cfg(n))
                }
                .map_err(cuda)?;
            }
        }
        let kernel = if kind == OptimKind::SgdMomentum {
            "sgd_step"
        } else {
            "adam_step"
        };
        checks.push(check(
            kernel,
            format!("{kind:?}, {steps} steps, weight decay 0.1"),
            &g.down(&ps)?,
            &want,
        ));
        opt.release(&mut d);
    }
    Ok(())
}
