//! Finding or making the Python that runs Helm: a venv is made once however many
//! threads ask at once, a broken one is made again, and each way it can fail says what
//! to do. A fake base Python stands in for `python3` so nothing is downloaded: its
//! `-m venv` makes a venv whose `python` runs the real helm-capable Python, and whose
//! `-m pip` only counts.

#![cfg(unix)]

use crate::common;

use std::path::{Path, PathBuf};

use ballast_helm::{Error, Helm};

struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("ballast-helm-setup-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An executable script at `path`, written by a child process, not by this one: a file this process holds open for writing
/// is inherited by any child another test thread forks meanwhile, until that child execs,
/// and executing the script then fails with ETXTBSY ("Text file busy").
fn script(path: &Path, text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "writing {}",
        path.display()
    );
}

/// A base Python whose `-m venv DIR` logs `venv` to `log` and makes DIR/bin/python; that
/// one logs `pip` for `-m pip …` and runs `real` for anything else.
fn fake_base_python(dir: &Path, real: &Path, log: &Path) -> PathBuf {
    let base = dir.join("python3");
    script(
        &base,
        &format!(
            r#"#!/bin/sh
[ "$1" = -m ] && [ "$2" = venv ] || exit 3
sleep 0.2
echo venv >> '{log}'
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'EOF'
#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then echo pip >> '{log}'; exit 0; fi
exec '{real}' "$@"
EOF
chmod +x "$3/bin/python"
"#,
            log = log.display(),
            real = real.display()
        ),
    );
    base
}

fn log_of(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn the_venv_is_made_once_for_threads_that_ask_at_once() {
    let real = common::helm().python().to_path_buf();
    let d = Dir::new("once");
    let log = d.0.join("log");
    let base = fake_base_python(&d.0, &real, &log);
    let cache = d.0.join("cache");
    let pythons: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| Helm::from_cache(&cache, &base)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{e}"))
                    .python()
                    .to_path_buf()
            })
            .collect()
    });
    assert_eq!(log_of(&log), "venv\npip\n", "one venv, one pip install");
    assert!(pythons.iter().all(|p| p == &pythons[0]));
    assert!(pythons[0].starts_with(&cache));
    // The venv works: Helm renders through it.
    let helm = Helm::from_cache(&cache, &base).unwrap();
    assert_eq!(log_of(&log), "venv\npip\n", "found, not made again");
    assert!(
        helm.helm_version().starts_with("v4."),
        "{}",
        helm.helm_version()
    );
    helm.render(common::chart_dir(), "r", "ns", "").unwrap();

    // Broken since (its Python gone): made again on the next call.
    std::fs::remove_file(&pythons[0]).unwrap();
    Helm::from_cache(&cache, &base).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(log_of(&log), "venv\npip\nvenv\npip\n");
}

#[test]
fn a_python_without_venv_names_the_debian_package() {
    let d = Dir::new("no-venv");
    let base = d.0.join("python3");
    script(
        &base,
        "#!/bin/sh\necho 'The virtual environment was not created successfully because ensurepip is not\navailable.' >&2\nexit 1\n",
    );
    let e = Helm::from_cache(d.0.join("cache"), &base).unwrap_err();
    let shown = e.to_string();
    assert!(matches!(e, Error::Setup(_)), "{e:?}");
    assert!(shown.contains("apt-get install python3-venv"), "{shown}");
    assert!(
        shown.contains("ensurepip is not"),
        "Python's own words: {shown}"
    );
    assert!(shown.contains("BALLAST_HELM_PYTHON"), "{shown}");
    assert!(
        !d.0.join("cache")
            .join("venv-helm-python-sdk-0.2.2")
            .exists(),
        "no half-made venv left"
    );
}

#[test]
fn no_python_at_all_is_said_so() {
    let d = Dir::new("no-python");
    let e = Helm::from_cache(d.0.join("cache"), d.0.join("no-such-python3")).unwrap_err();
    assert!(matches!(e, Error::Setup(_)), "{e:?}");
    assert!(e.to_string().contains("no-such-python3"), "{e}");
    let e = Helm::with_python(d.0.join("no-such-python")).unwrap_err();
    assert!(matches!(e, Error::Setup(_)), "{e:?}");
    assert!(e.to_string().contains("cannot run"), "{e}");
}

#[test]
fn a_python_without_the_sdk_is_refused() {
    let d = Dir::new("no-sdk");
    // A bare venv of the helm-capable Python: the same interpreter, none of its packages.
    let real = common::helm().python();
    let venv = d.0.join("bare");
    let made = std::process::Command::new(real)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    let e = Helm::with_python(venv.join("bin/python")).unwrap_err();
    assert!(matches!(e, Error::Setup(_)), "{e:?}");
    let shown = e.to_string();
    assert!(shown.contains("cannot import helm_python"), "{shown}");
    assert!(shown.contains("helm-python-sdk==0.2.2"), "{shown}");

    // Something that is not Python at all.
    let e = Helm::with_python("/bin/true").unwrap_err();
    assert!(matches!(e, Error::Setup(_)), "{e:?}");
    assert!(e.to_string().contains("did not answer"), "{e}");
}
