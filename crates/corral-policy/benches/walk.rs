//! The project walk `resolve` does to find the files `filesystem.hide` masks, on a tree of
//! 100,000 files (10 x 10 x 10 directories of 100 files, a `.env` in every leaf directory, and
//! 2,000 files under `.git/objects` that the walk skips).
//!
//! `cargo bench -p corral-policy --bench walk`; `CORRAL_BENCH_TREE=DIR` reuses (or creates) the
//! tree at DIR, so `find` and `corral plan` can be measured on the same one (docs/BENCHMARKS.md).

use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};

/// Create the benchmark tree under `root` unless it is already there.
pub fn make_tree(root: &Path) {
    let marker = root.join(".tree-complete");
    if marker.exists() {
        return;
    }
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    for a in 0..10 {
        for b in 0..10 {
            for c in 0..10 {
                let dir = root.join(format!("d{a}/e{b}/f{c}"));
                std::fs::create_dir_all(&dir).unwrap();
                for i in 0..99 {
                    std::fs::write(dir.join(format!("file{i}.rs")), "").unwrap();
                }
                std::fs::write(dir.join(".env"), "").unwrap();
            }
        }
    }
    for o in 0..20 {
        let dir = root.join(format!(".git/objects/{o:02x}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            std::fs::write(dir.join(format!("{i:038x}")), "").unwrap();
        }
    }
    std::fs::write(marker, "").unwrap();
}

fn bench(c: &mut Criterion) {
    let (root, _tmp): (PathBuf, Option<tempfile::TempDir>) =
        match std::env::var_os("CORRAL_BENCH_TREE") {
            Some(d) => (PathBuf::from(d), None),
            None => {
                let t = tempfile::tempdir().unwrap();
                (t.path().to_path_buf(), Some(t))
            }
        };
    make_tree(&root);
    let hide: Vec<String> = [".env", ".env.*", "*.pem", "*.key"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let found = corral_policy::resolve::find_masked(&root, &hide).unwrap();
    assert_eq!(found.len(), 1000, "one .env per leaf directory");
    let mut g = c.benchmark_group("project walk");
    g.sample_size(20);
    g.bench_function("find_masked, 100k files", |b| {
        b.iter(|| corral_policy::resolve::find_masked(&root, &hide).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
