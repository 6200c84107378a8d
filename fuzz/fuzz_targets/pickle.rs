//! PyTorch snapshot pickles: the sequential reader and the parallel one (4 threads, 4 KiB
//! chunks, so a small input is cut into pieces) must agree on every input: both refuse it with
//! the same message, or both accept it with the same segments and events. Then `summary`
//! reads it as a user would.
#![no_main]

#[path = "common.rs"]
mod common;

use gpumem::snapshot::{load_with, Snapshot};
use libfuzzer_sys::fuzz_target;

/// What the two readers must agree on (stacks are numbered in reading order, so by tags).
fn key(s: &Snapshot) -> String {
    let mut k = format!("{:?} {} {:?} {:?}\n", s.devices, s.device, s.times, s.skipped);
    for e in &s.events {
        k += &format!(
            "{:?} {} {} {} {:?}\n",
            e.kind(),
            e.addr,
            e.size(),
            e.stream,
            s.tags.resolve(e.stack)
        );
    }
    for g in &s.segments {
        k += &format!("seg {} {} {:?}\n", g.address, g.total_size, g.pool);
        for b in &g.blocks {
            k += &format!(
                "  {} {} {} {:?} {:?}\n",
                b.address,
                b.size,
                b.requested_size,
                b.state,
                s.tags.resolve(b.stack)
            );
        }
    }
    k + &format!("{:?} {:?}", s.annotations, s.iterations)
}

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = common::file("s.pickle", data);
    let one = load_with(&path, 1, None);
    let par = load_with(&path, 4, Some(4096));
    match (&one, &par) {
        (Ok(a), Ok(b)) => assert_eq!(key(a), key(b), "the readers disagree"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (Ok(_), Err(e)) => panic!("only the parallel reader refuses it: {e}"),
        (Err(e), Ok(_)) => panic!("only the sequential reader refuses it: {e}"),
    }
    if one.is_ok() {
        common::gpumem(&["summary", path.to_str().unwrap()]);
    }
});
