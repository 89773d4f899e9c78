//! The container image `scripts/image.sh` builds holds everything ftrec needs: built from this
//! test's own binary, it answers `--version` and runs a small cluster job (`ftrec run` starts
//! its servers and worker by running its own binary again, so a library, a directory or a
//! permission the image lacks fails the job), as the image's user, writing to /tmp and /work.
//!
//! It needs buildah (to build) and podman (to run), and a machine where podman can run a
//! container. Without them it prints one `skipped: ...` line and passes: it never installs
//! anything. Both keep their images in a containers storage of their own in a temporary
//! directory, so the machine's image store is left alone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn has(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn first_line(out: &Output) -> String {
    text(out)
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// podman over a storage of its own (vfs: no overlay mounts needed).
struct Podman {
    conf: PathBuf,
}

impl Podman {
    fn new(dir: &Path) -> Podman {
        let conf = dir.join("storage.conf");
        std::fs::write(
            &conf,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/storage\"\nrunroot = \"{0}/run\"\n",
                dir.display()
            ),
        )
        .unwrap();
        Podman { conf }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_STORAGE_CONF", &self.conf);
        c
    }

    /// `podman run --rm --network none OPTS IMAGE ARGS`.
    fn run(&self, opts: &[&str], image: &str, args: &[&str]) -> Output {
        self.cmd()
            .args(["run", "--rm", "--network", "none"])
            .args(opts)
            .arg(image)
            .args(args)
            .output()
            .unwrap()
    }
}

/// A failure of the container runtime in this environment (limits it may not raise, cgroups
/// it cannot use), as opposed to an image that does not work.
fn runtime_refused(out: &Output) -> bool {
    let t = text(out).to_lowercase();
    [
        "rlimit",
        "cgroup",
        "operation not permitted",
        "permission denied",
    ]
    .iter()
    .any(|w| t.contains(w))
}

#[test]
fn the_image_runs_ftrec_and_a_cluster_job() {
    if !has("buildah") {
        println!("skipped: buildah is not installed (scripts/image.sh builds with it)");
        return;
    }
    if !has("podman") {
        println!("skipped: podman is not installed (it runs the image)");
        return;
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_ftrec"));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("ftrec-oci.tar");
    let tag = "ftrec-image-test:latest";
    let built = Command::new("bash")
        .arg(repo.join("scripts/image.sh"))
        .arg("--binary")
        .arg(exe)
        .arg("--out")
        .arg(&archive)
        .args(["--tag", tag])
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    assert!(built.status.success(), "scripts/image.sh: {}", text(&built));

    let podman = Podman::new(dir.path());
    let loaded = podman
        .cmd()
        .arg("load")
        .arg("-i")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(loaded.status.success(), "podman load: {}", text(&loaded));
    let image = format!("localhost/{tag}");

    // The runtime's defaults first; then limits no higher than this process's own (a runtime
    // that may not raise them fails to set its defaults), and runc if crun is refused.
    let limits = [
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
    ];
    let mut tries: Vec<Vec<&str>> = vec![vec![], limits.to_vec()];
    if has("runc") {
        tries.push([["--runtime", "runc"].as_slice(), &limits].concat());
    }
    let mut opts = None;
    let mut refusal = String::new();
    for t in tries {
        let out = podman.run(&t, &image, &["--version"]);
        if out.status.success() {
            let version = String::from_utf8_lossy(&out.stdout);
            assert!(
                version.contains(env!("CARGO_PKG_VERSION")),
                "ftrec --version in the image: {version}"
            );
            opts = Some(t);
            break;
        }
        assert!(
            runtime_refused(&out),
            "ftrec --version in the image failed: {}",
            text(&out)
        );
        if refusal.is_empty() {
            refusal = first_line(&out);
        }
    }
    let Some(opts) = opts else {
        println!("skipped: podman cannot run a container here ({refusal})");
        return;
    };

    // Two servers and a worker, started by `ftrec run` from the image's binary, as uid 10001:
    // its work directory under /tmp, the report in /work.
    let out = podman.run(
        &opts,
        &image,
        &[
            "run",
            "--preset",
            "tiny",
            "--servers",
            "2",
            "--workers",
            "1",
            "--sync",
            "--steps",
            "5",
            "--json",
            "/work/report.json",
        ],
    );
    assert!(
        out.status.success(),
        "ftrec run in the image: {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(": 5 steps"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("report written to /work/report.json"),
        "{}",
        text(&out)
    );
    let _ = podman.cmd().args(["rmi", "--force", &image]).output();
}
