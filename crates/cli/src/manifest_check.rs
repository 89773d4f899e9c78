//! The Kubernetes manifests of `deploy/k8s` run real commands. Every kustomization there (the
//! base and each overlay) is rendered (`kubectl kustomize DIR`, or without kubectl the YAML
//! files its `resources` list, patches left out), and for every container of the ftrec image:
//! - its command line, with `$(VAR)` expanded from the container's env as Kubernetes does
//!   (values from the downward API replaced by samples such as `ftrec-server-1`, from Secrets
//!   and ConfigMaps by `sample`), parses with the binary's own flags ([`crate::flags::Cli`]);
//! - its probes (liveness `/healthz`, readiness `/readyz`) and its Prometheus port annotation
//!   point at the port of its `--metrics-listen`.
//!
//! And across the job: the servers' `--servers` equals their StatefulSet's replicas and the
//! coordinator's `--servers` and `--server-addr` count, each `--server-addr` names server N's
//! stable DNS name and port in order; the coordinator's `--workers` equals the worker Job's
//! completions, and the workers' `--coordinator` is the coordinator's Service and port.
//!
//! A failure names the kustomization, the resource, the container and what is wrong (for a
//! flag, clap's one-line error).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde::Deserialize;
use serde_json::Value;

fn repo_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

fn deploy_dir() -> PathBuf {
    repo_dir().join("deploy/k8s")
}

/// `path` from the repository's root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(repo_dir())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The directories under `deploy/k8s` that hold a kustomization, base first.
fn kustomizations() -> Vec<PathBuf> {
    let root = deploy_dir();
    let mut dirs = vec![root.join("base")];
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(root.join("overlays"))
        .expect("deploy/k8s/overlays")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .collect();
    overlays.sort();
    dirs.extend(overlays);
    dirs
}

/// The documents of a YAML stream (empty documents dropped).
fn yaml_documents(text: &str, what: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// One rendered resource and where it came from (a file, or the kustomization rendered).
struct Resource {
    source: String,
    value: Value,
}

/// `kubectl kustomize DIR`, or `None` when there is no kubectl.
fn render_with_kubectl(dir: &Path) -> Option<Vec<Resource>> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running kubectl kustomize {}: {e}", dir.display()),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let what = format!("kubectl kustomize {}", shown(dir));
    Some(
        yaml_documents(&text, &what)
            .into_iter()
            .map(|value| Resource {
                source: what.clone(),
                value,
            })
            .collect(),
    )
}

/// The YAML files a kustomization lists under `resources`, read as they are (a directory
/// listed is another kustomization, read the same way). Patches are not applied.
fn render_raw(dir: &Path) -> Vec<Resource> {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let k = yaml_documents(&text, &path.display().to_string());
    let listed = k
        .first()
        .and_then(|k| k.get("resources"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for entry in listed {
        let entry = entry.as_str().expect("a resources entry is a path");
        let p = dir.join(entry);
        if p.is_dir() {
            out.extend(render_raw(&p));
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let source = shown(&p);
        out.extend(
            yaml_documents(&text, &source)
                .into_iter()
                .map(|value| Resource {
                    source: source.clone(),
                    value,
                }),
        );
    }
    out
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn num_at(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

/// Whether `image` is the ftrec image (`ftrec:TAG`, `REGISTRY/PATH/ftrec:TAG`, `...@sha256:..`).
fn is_ftrec_image(image: &str) -> bool {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split(':').next() == Some("ftrec")
}

/// The pod spec of a workload, if the resource has one.
fn pod_spec(r: &Value) -> Option<&Value> {
    match r.get("kind")?.as_str()? {
        "Pod" => r.get("spec"),
        "CronJob" => r.pointer("/spec/jobTemplate/spec/template/spec"),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            r.pointer("/spec/template/spec")
        }
        _ => None,
    }
}

/// A stand-in for a value Kubernetes fills in at run time.
fn sample_field(kind: &str, name: &str, field_path: &str) -> String {
    match field_path {
        // A StatefulSet's pods are NAME-0, NAME-1, ...; other pods get a random suffix.
        "metadata.name" if kind == "StatefulSet" => format!("{name}-1"),
        "metadata.name" => format!("{name}-x7k2p"),
        "metadata.namespace" => "default".into(),
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        | "metadata.labels['batch.kubernetes.io/job-completion-index']" => "1".into(),
        "status.podIP" | "status.hostIP" => "10.0.0.7".into(),
        "spec.nodeName" => "node-1".into(),
        _ => "sample".into(),
    }
}

/// `text` with every `$(VAR)` replaced from `env` as the kubelet does (`$$` stands for `$`);
/// a reference to a variable not in `env` is an error.
fn expand(text: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((var, tail)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match env.get(var) {
                Some(v) => out.push_str(v),
                None => return Err(format!("$({var}) names no variable of the container's env")),
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The container's env, in order, each value expanded from the ones before it.
fn container_env(
    kind: &str,
    name: &str,
    container: &Value,
) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for e in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let var = str_at(e, &["name"]).ok_or("an env entry without a name")?;
        let value = if let Some(v) = e.get("value") {
            let v = v
                .as_str()
                .ok_or_else(|| format!("env {var}: a value that is not a string"))?;
            expand(v, &env).map_err(|m| format!("env {var}: {m}"))?
        } else if let Some(path) = str_at(e, &["valueFrom", "fieldRef", "fieldPath"]) {
            sample_field(kind, name, path)
        } else if e.pointer("/valueFrom/resourceFieldRef").is_some() {
            "1".into()
        } else {
            // secretKeyRef, configMapKeyRef.
            "sample".into()
        };
        env.insert(var.to_string(), value);
    }
    Ok(env)
}

/// The values of `flag` in `argv` (`--flag V` and `--flag=V`).
fn flag_values<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == flag {
            if let Some(v) = it.next() {
                out.push(v.as_str());
            }
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v);
        }
    }
    out
}

fn port_of(host_port: &str) -> Option<u16> {
    host_port.rsplit_once(':')?.1.parse().ok()
}

/// An ftrec container of a rendered workload, its command line parsed.
struct FtrecContainer {
    /// `KIND/NAME container C (SOURCE)`, for messages.
    at: String,
    kind: String,
    name: String,
    resource: Value,
    container: Value,
    /// The command line, `ftrec` first, variables expanded.
    argv: Vec<String>,
}

impl FtrecContainer {
    /// The subcommand (`server`, `coordinator`, `worker`, ...).
    fn role(&self) -> &str {
        self.argv.get(1).map_or("", String::as_str)
    }

    fn flag(&self, flag: &str) -> Option<&str> {
        flag_values(&self.argv, flag).last().copied()
    }

    /// The port a probe names: a number, or a name among the container's ports.
    fn probe_port(&self, port: &Value) -> Option<u64> {
        if let Some(n) = port.as_u64() {
            return Some(n);
        }
        let name = port.as_str()?;
        if let Ok(n) = name.parse() {
            return Some(n);
        }
        self.container
            .get("ports")?
            .as_array()?
            .iter()
            .find(|p| str_at(p, &["name"]) == Some(name))
            .and_then(|p| num_at(p, &["containerPort"]))
    }
}

/// The ftrec containers of `resources`, each with its command line parsed; what fails to
/// expand or parse goes to `problems`.
fn ftrec_containers(resources: &[Resource], problems: &mut Vec<String>) -> Vec<FtrecContainer> {
    let mut out = Vec::new();
    for r in resources {
        let Some(pod) = pod_spec(&r.value) else {
            continue;
        };
        let kind = str_at(&r.value, &["kind"]).unwrap_or("?").to_string();
        let name = str_at(&r.value, &["metadata", "name"])
            .unwrap_or("?")
            .to_string();
        for list in ["initContainers", "containers"] {
            for c in pod
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !str_at(c, &["image"]).is_some_and(is_ftrec_image) {
                    continue;
                }
                let cname = str_at(c, &["name"]).unwrap_or("?");
                let at = format!("{kind}/{name} container {cname} ({})", r.source);
                let words = |key: &str| -> Vec<String> {
                    c.get(key)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|w| match w {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        })
                        .collect()
                };
                let command = words("command");
                // Without a command the image's entry point runs: /usr/local/bin/ftrec.
                let mut raw = vec!["ftrec".to_string()];
                match command.split_first() {
                    None => {}
                    Some((exe, rest)) if Path::new(exe).file_name() == Some("ftrec".as_ref()) => {
                        raw.extend_from_slice(rest)
                    }
                    Some((exe, _)) => {
                        problems.push(format!("{at}: command {exe:?} is not the ftrec binary"));
                        continue;
                    }
                }
                raw.extend(words("args"));
                let argv = container_env(&kind, &name, c).and_then(|env| {
                    raw.iter()
                        .map(|a| expand(a, &env))
                        .collect::<Result<Vec<_>, _>>()
                });
                let argv = match argv {
                    Ok(argv) => argv,
                    Err(m) => {
                        problems.push(format!("{at}: {m}"));
                        continue;
                    }
                };
                if let Err(e) = crate::flags::Cli::try_parse_from(&argv) {
                    problems.push(format!(
                        "{at}: `{}`: {}",
                        argv[1..].join(" "),
                        ftrec_cluster::args::one_line(&e)
                    ));
                    continue;
                }
                out.push(FtrecContainer {
                    at,
                    kind: kind.clone(),
                    name: name.clone(),
                    resource: r.value.clone(),
                    container: c.clone(),
                    argv,
                });
            }
        }
    }
    out
}

/// Probes and the Prometheus port annotation against `--metrics-listen`.
fn check_metrics_port(c: &FtrecContainer, problems: &mut Vec<String>) {
    let probes: Vec<(&str, &Value)> = ["livenessProbe", "readinessProbe", "startupProbe"]
        .into_iter()
        .filter_map(|p| c.container.get(p).map(|v| (p, v)))
        .collect();
    let Some(listen) = c.flag("--metrics-listen") else {
        if !probes.is_empty() {
            problems.push(format!("{}: probes but no --metrics-listen", c.at));
        }
        return;
    };
    let Some(port) = port_of(listen) else {
        problems.push(format!("{}: --metrics-listen {listen} has no port", c.at));
        return;
    };
    for (what, probe) in probes {
        let Some(http) = probe.get("httpGet") else {
            problems.push(format!("{}: {what} is not an HTTP probe", c.at));
            continue;
        };
        let path = str_at(http, &["path"]).unwrap_or("/");
        let want = if what == "readinessProbe" {
            "/readyz"
        } else {
            "/healthz"
        };
        if path != want {
            problems.push(format!("{}: {what} asks {path}, not {want}", c.at));
        }
        match http.get("port").and_then(|p| c.probe_port(p)) {
            Some(p) if p == u64::from(port) => {}
            other => problems.push(format!(
                "{}: {what} port {other:?} is not --metrics-listen's {port}",
                c.at
            )),
        }
    }
    let annotations = c
        .resource
        .pointer("/spec/template/metadata/annotations")
        .or_else(|| c.resource.pointer("/metadata/annotations"));
    if let Some(p) = annotations.and_then(|a| str_at(a, &["prometheus.io/port"])) {
        if p != port.to_string() {
            problems.push(format!(
                "{}: prometheus.io/port {p} is not --metrics-listen's {port}",
                c.at
            ));
        }
    }
}

/// The sizes of the job agree between the servers, the coordinator and the workers.
fn check_job_shape(dir: &str, cs: &[FtrecContainer], resources: &[Resource]) -> Vec<String> {
    let mut problems = Vec::new();
    let servers: Vec<&FtrecContainer> = cs
        .iter()
        .filter(|c| c.role() == "server" && c.kind == "StatefulSet")
        .collect();
    let coordinators: Vec<&FtrecContainer> =
        cs.iter().filter(|c| c.role() == "coordinator").collect();
    let workers: Vec<&FtrecContainer> = cs.iter().filter(|c| c.role() == "worker").collect();
    if servers.len() != 1 || coordinators.len() != 1 || workers.is_empty() {
        problems.push(format!(
            "{dir}: expected one server StatefulSet, one coordinator and workers; found {} \
             server StatefulSets, {} coordinators, {} worker containers",
            servers.len(),
            coordinators.len(),
            workers.len()
        ));
        return problems;
    }
    let (s, co) = (servers[0], coordinators[0]);
    let replicas = num_at(&s.resource, &["spec", "replicas"]).unwrap_or(1);
    let service = str_at(&s.resource, &["spec", "serviceName"]).unwrap_or("");
    let num = |c: &FtrecContainer, flag: &str| c.flag(flag).and_then(|v| v.parse::<u64>().ok());
    if num(s, "--servers") != Some(replicas) {
        problems.push(format!(
            "{}: --servers {:?} but {replicas} replicas",
            s.at,
            s.flag("--servers")
        ));
    }
    let addrs = flag_values(&co.argv, "--server-addr");
    if num(co, "--servers") != Some(replicas) || addrs.len() as u64 != replicas {
        problems.push(format!(
            "{}: --servers {:?} and {} --server-addr, but the servers' StatefulSet has {replicas} \
             replicas",
            co.at,
            co.flag("--servers"),
            addrs.len()
        ));
    }
    let server_port = s.flag("--listen").and_then(port_of);
    for (i, a) in addrs.iter().enumerate() {
        let want = format!("{}-{i}.{service}", s.name);
        let (host, port) = a.rsplit_once(':').unwrap_or((a, ""));
        // The short name, or a longer one in the cluster's domain.
        let host_ok = host == want || host.starts_with(&format!("{want}."));
        if !host_ok || port.parse::<u16>().ok() != server_port {
            problems.push(format!(
                "{}: --server-addr {a} is not server {i} ({want}:{})",
                co.at,
                server_port.map_or("?".into(), |p| p.to_string())
            ));
        }
    }
    if !resources.iter().any(|r| {
        str_at(&r.value, &["kind"]) == Some("Service")
            && str_at(&r.value, &["metadata", "name"]) == Some(service)
            && str_at(&r.value, &["spec", "clusterIP"]) == Some("None")
    }) {
        problems.push(format!(
            "{}: no headless Service {service:?} for its pods' DNS names",
            s.at
        ));
    }
    let want_workers = num(co, "--workers");
    let control_port = co.flag("--control-listen").and_then(port_of);
    for w in &workers {
        if w.kind == "Job" {
            let completions = num_at(&w.resource, &["spec", "completions"]);
            let parallelism = num_at(&w.resource, &["spec", "parallelism"]);
            if completions != want_workers || parallelism != completions {
                problems.push(format!(
                    "{}: completions {completions:?} and parallelism {parallelism:?}, but the \
                     coordinator's --workers is {want_workers:?}",
                    w.at
                ));
            }
            if str_at(&w.resource, &["spec", "completionMode"]) != Some("Indexed") {
                problems.push(format!("{}: not an Indexed Job", w.at));
            }
        }
        let target = w.flag("--coordinator").unwrap_or("");
        let (host, port) = target.rsplit_once(':').unwrap_or((target, ""));
        let service = host.split('.').next().unwrap_or("");
        let is_service = resources.iter().any(|r| {
            str_at(&r.value, &["kind"]) == Some("Service")
                && str_at(&r.value, &["metadata", "name"]) == Some(service)
        });
        if !is_service || port.parse::<u16>().ok() != control_port {
            problems.push(format!(
                "{}: --coordinator {target} is not a Service at the coordinator's \
                 --control-listen port {control_port:?}",
                w.at
            ));
        }
    }
    problems
}

/// Every check on one rendering of a kustomization.
fn check(dir: &str, resources: &[Resource]) -> Vec<String> {
    let mut problems = Vec::new();
    let cs = ftrec_containers(resources, &mut problems);
    for c in &cs {
        check_metrics_port(c, &mut problems);
    }
    if problems.is_empty() {
        problems.extend(check_job_shape(dir, &cs, resources));
    }
    problems
}

fn report(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s) in deploy/k8s:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_kustomization_runs_real_flags() {
    let mut problems = Vec::new();
    let mut fallback = false;
    for dir in kustomizations() {
        let name = shown(&dir);
        let resources = render_with_kubectl(&dir).unwrap_or_else(|| {
            fallback = true;
            render_raw(&dir)
        });
        problems.extend(check(&name, &resources));
    }
    if fallback {
        println!(
            "no kubectl: checked the YAML files the kustomizations list, without their patches"
        );
    }
    report(problems);
}

/// The files as written, without kubectl: the same checks, so that they run everywhere and
/// the files themselves (not only kustomize's output) stay valid YAML.
#[test]
fn listed_files_run_real_flags() {
    let mut problems = Vec::new();
    for dir in kustomizations() {
        let name = shown(&dir);
        problems.extend(check(&name, &render_raw(&dir)));
    }
    report(problems);
}

#[test]
fn variables_expand_as_the_kubelet_does() {
    let env: BTreeMap<String, String> = [("POD_NAME", "s-1"), ("J", "demo")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect();
    assert_eq!(expand("$(POD_NAME)", &env).unwrap(), "s-1");
    assert_eq!(expand("s3://b/$(J)/x", &env).unwrap(), "s3://b/demo/x");
    assert_eq!(expand("$$(J) $5", &env).unwrap(), "$(J) $5");
    assert!(expand("$(NOPE)", &env).unwrap_err().contains("NOPE"));
    assert!(is_ftrec_image("ftrec:0.1.0"));
    assert!(is_ftrec_image("registry.example:5000/ml/ftrec@sha256:00"));
    assert!(!is_ftrec_image("minio/minio:RELEASE"));
    let argv: Vec<String> = ["ftrec", "x", "--a", "1", "--a=2", "--ab", "3"]
        .map(String::from)
        .to_vec();
    assert_eq!(flag_values(&argv, "--a"), ["1", "2"]);
}

/// A small job in the manifests' shape, with flags every build has.
const FIXTURE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: ps}
spec: {clusterIP: None}
---
apiVersion: v1
kind: Service
metadata: {name: coord}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ps}
spec:
  serviceName: ps
  replicas: 2
  template:
    metadata:
      annotations: {prometheus.io/port: "7000"}
    spec:
      containers:
        - name: server
          image: registry.example/ftrec:1
          args: [server, --id, "$(N)", --servers, "2", --preset, tiny, --listen, "0.0.0.0:7000"]
          env:
            - {name: N, value: "1"}
---
apiVersion: batch/v1
kind: Job
metadata: {name: coord}
spec:
  template:
    spec:
      containers:
        - name: coordinator
          image: ftrec:1
          command: [/usr/local/bin/ftrec]
          args: [coordinator, --servers, "2", --workers, "2", --server-addr, "ps-0.ps:7000",
                 --server-addr, "ps-1.ps.default.svc.cluster.local:7000",
                 --control-listen, "0.0.0.0:7100", --job-id, "$(J)"]
          env:
            - name: J
              valueFrom: {configMapKeyRef: {name: c, key: j}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: w}
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  template:
    spec:
      containers:
        - name: worker
          image: ftrec:1
          args: [worker, --coordinator, "coord:7100", --id, "$(JOB_COMPLETION_INDEX)"]
          env:
            - name: JOB_COMPLETION_INDEX
              valueFrom:
                fieldRef:
                  fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
        - name: sidecar
          image: busybox:1
          args: [--not-ftrec]
"#;

/// The checks pass the fixture and catch each kind of mistake in it.
#[test]
fn the_checks_catch_mistakes() {
    let edit = |f: &dyn Fn(&mut Value)| -> Vec<String> {
        let mut rs: Vec<Resource> = yaml_documents(FIXTURE, "fixture")
            .into_iter()
            .map(|value| Resource {
                source: "fixture".into(),
                value,
            })
            .collect();
        for r in &mut rs {
            f(&mut r.value);
        }
        check("fixture", &rs)
    };
    let problems = edit(&|_| {});
    assert!(problems.is_empty(), "{problems:?}");
    let on = |kind: &'static str, f: fn(&mut Value)| {
        move |v: &mut Value| {
            if str_at(v, &["kind"]) == Some(kind) {
                f(v)
            }
        }
    };
    fn args(v: &mut Value) -> &mut Vec<Value> {
        v.pointer_mut("/spec/template/spec/containers/0/args")
            .unwrap()
            .as_array_mut()
            .unwrap()
    }
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "3 replicas",
            Box::new(on("StatefulSet", |v| v["spec"]["replicas"] = 3.into())),
        ),
        (
            "unexpected argument '--no-such-flag'",
            Box::new(on("StatefulSet", |v| args(v).push("--no-such-flag".into()))),
        ),
        (
            "$(UNSET) names no variable",
            Box::new(on("StatefulSet", |v| args(v)[2] = "$(UNSET)".into())),
        ),
        (
            "is not server 1",
            Box::new(|v: &mut Value| {
                if str_at(v, &["metadata", "name"]) == Some("coord")
                    && str_at(v, &["kind"]) == Some("Job")
                {
                    args(v)[8] = "ps-0.ps:7000".into();
                }
            }),
        ),
        (
            "completions Some(3)",
            Box::new(on("Job", |v| {
                if v.pointer("/spec/completions").is_some() {
                    v["spec"]["completions"] = 3.into();
                    v["spec"]["parallelism"] = 3.into();
                }
            })),
        ),
        (
            "probes but no --metrics-listen",
            Box::new(on("StatefulSet", |v| {
                v["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] =
                    serde_json::json!({"httpGet": {"path": "/healthz", "port": 9100}});
            })),
        ),
        (
            "is not the ftrec binary",
            Box::new(on("Job", |v| {
                if let Some(c) = v.pointer_mut("/spec/template/spec/containers/0/command") {
                    *c = serde_json::json!(["sh", "-c"]);
                }
            })),
        ),
    ];
    for (want, f) in cases {
        let problems = edit(&*f);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "expected a problem with {want:?}, got {problems:?}"
        );
    }
    // Probes against --metrics-listen, on a container built by hand (its command line is not
    // parsed here, so this holds with any set of flags).
    let container = serde_json::json!({
        "ports": [{"name": "metrics", "containerPort": 9100}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 9101}},
    });
    let c = FtrecContainer {
        at: "StatefulSet/ps container server (fixture)".into(),
        kind: "StatefulSet".into(),
        name: "ps".into(),
        resource: serde_json::json!({"spec": {"template": {"metadata": {"annotations":
            {"prometheus.io/port": "9200"}}}}}),
        container,
        argv: ["ftrec", "server", "--metrics-listen=0.0.0.0:9100"]
            .map(String::from)
            .to_vec(),
    };
    let mut problems = Vec::new();
    check_metrics_port(&c, &mut problems);
    let want = [
        "readinessProbe asks /healthz, not /readyz",
        "readinessProbe port Some(9101) is not --metrics-listen's 9100",
        "prometheus.io/port 9200 is not --metrics-listen's 9100",
    ];
    assert_eq!(problems.len(), want.len(), "{problems:?}");
    for w in want {
        assert!(problems.iter().any(|p| p.contains(w)), "{w}: {problems:?}");
    }
}
