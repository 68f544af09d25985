//! Dynamic shell completions (issue 42, item 7): bash completes deployment, task and Nest names
//! asked of a real Hub through `agen __complete`, and falls back to the static completions
//! where no name fits.

use std::process::Command;

use agen_tests::{agen_bin, HubProcess};

/// What bash offers for `line` + TAB, through the script `agen completions bash` prints.
fn bash_offers(hub: &HubProcess, line: &[&str]) -> Vec<String> {
    let agen = agen_bin();
    let words: Vec<String> = std::iter::once(agen.to_string_lossy().into_owned())
        .chain(line.iter().map(|w| format!("'{w}'")))
        .collect();
    let script = format!(
        "source <('{bin}' completions bash)\nCOMP_WORDS=({words})\nCOMP_CWORD={cword}\n_agen_names\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bin = agen.display(),
        words = words.join(" "),
        cword = line.len(),
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_deployment_task_and_nest_names_from_the_hub() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("comp-nest", &[], &[]).unwrap();
    let dir = tmp.path().join("bundle");
    let init = Command::new(agen_bin())
        .args(["init", dir.to_str().unwrap()])
        .args([
            "--model",
            "openai/fake-model",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    for name in ["completer", "compiler"] {
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = hub.cli(&["submit", "completer", "hello"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8_lossy(&out.stdout).trim().to_owned();

    let offers = (
        bash_offers(&hub, &["scale", "comp"]),
        bash_offers(&hub, &["scale", "compl"]),
        bash_offers(&hub, &["wait", ""]),
        bash_offers(&hub, &["nests", "drain", ""]),
        bash_offers(&hub, &["tasks", "--deployment", "compi"]),
    );
    assert_eq!(
        offers,
        (
            vec!["compiler".to_string(), "completer".to_string()],
            vec!["completer".to_string()],
            vec![task],
            vec!["comp-nest".to_string()],
            vec!["compiler".to_string()],
        )
    );
    // No name fits after `scale NAME`: the static completions answer (no Hub names).
    let after = bash_offers(&hub, &["scale", "completer", ""]);
    assert!(
        !after.iter().any(|o| o == "completer" || o == "compiler"),
        "{after:?}"
    );
}
