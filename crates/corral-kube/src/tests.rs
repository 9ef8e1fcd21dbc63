use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use corral_policy::domain::DomainPattern;
use corral_policy::plan::{NetworkMode, Plan};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::*;
use crate::eval::{Endpoint, PodInfo, allowed};

pub(crate) fn opts() -> Options {
    Options {
        name: "corral-demo".into(),
        namespace: Some("agents".into()),
        proxy_ip: Some("10.96.0.50".into()),
        proxy_image: "localhost/corral-proxy:0.1.0".into(),
        image: None,
        target: Target::Pod,
        executor: None,
        seccomp: Seccomp::Localhost,
        project: ProjectSource::Claim("demo-project".into()),
        pids_by_node: true,
        existing: BTreeSet::from([PathBuf::from("/work/demo/.git/hooks")]),
        dirs: BTreeSet::from([PathBuf::from("/work/demo/secrets")]),
        node_files: None,
        tty: true,
    }
}

/// A plan with fixed ids, the proxy, one allow_cidrs entry, a masked file and directory, a
/// protected directory and the (missing) policy file.
pub(crate) fn plan() -> Plan {
    let root = Path::new("/work/demo");
    let mut plan = Plan::minimal(
        root,
        Path::new("/home/dev"),
        vec!["/usr/bin/pi".into(), "--verbose".into()],
    );
    plan.profile = "pi".into();
    plan.uid = 1000;
    plan.gid = 1000;
    plan.network.mode = NetworkMode::Proxy;
    plan.network.allow = vec![DomainPattern::parse("api.anthropic.com").unwrap()];
    plan.network.allow_cidrs = vec!["10.20.0.0/16".parse().unwrap()];
    plan.masked = vec![root.join(".env"), root.join("secrets")];
    plan.protected = vec![root.join("corral.toml"), root.join(".git/hooks")];
    plan.limits.memory = Some(4 << 30);
    plan.limits.cpus = Some(1.5);
    plan.limits.pids = Some(1024);
    plan.image = Some("localhost/corral-pi:latest".into());
    plan
}

#[test]
fn renders_the_whole_jail() {
    let yaml = to_yaml(&render(&plan(), &opts()).unwrap()).unwrap();
    if std::env::var_os("CORRAL_BLESS").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/src/tests/jail.yaml"),
            &yaml,
        )
        .unwrap();
    }
    similar_asserts::assert_eq!(yaml, include_str!("tests/jail.yaml"));
}

#[test]
fn renders_the_sandbox_template_whole() {
    let mut o = opts();
    o.target = Target::SandboxTemplate;
    o.project = ProjectSource::HostPath;
    o.seccomp = Seccomp::RuntimeDefault;
    let objects = render(&plan(), &o).unwrap();
    let yaml = to_yaml(&objects[objects.len() - 1..]).unwrap();
    if std::env::var_os("CORRAL_BLESS").is_some() {
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/tests/sandbox-template.yaml"
            ),
            &yaml,
        )
        .unwrap();
    }
    similar_asserts::assert_eq!(yaml, include_str!("tests/sandbox-template.yaml"));
    // The template's Pods carry the sandbox's labels: the same policies fence them.
    let pod = render(&plan(), &opts()).unwrap();
    assert_eq!(policies(&objects), policies(&pod));
}

#[test]
fn refuses_what_it_cannot_carry() {
    let mut p = plan();
    p.network.mode = NetworkMode::Host;
    assert!(matches!(
        render(&p, &opts()),
        Err(KubeError::Unsupported { .. })
    ));
    let mut o = opts();
    o.proxy_ip = None;
    assert!(matches!(render(&plan(), &o), Err(KubeError::NoProxyIp)));
    let mut o = opts();
    o.pids_by_node = false;
    assert!(matches!(render(&plan(), &o), Err(KubeError::PidsLimit)));
    // The same limit as corral's built-in default renders, and says how processes are bounded.
    let mut p = plan();
    p.limits.built_in.pids = true;
    assert!(render(&p, &o).is_ok());
    assert_eq!(
        not_carried(&p, &o),
        vec![
            "limits.pids = 1024 (corral's default): a Pod cannot carry a pids limit, so on the \
             cluster processes are bounded only by the nodes' kubelet podPidsLimit (pass \
             --pids-by-node when your nodes set it)"
                .to_string()
        ]
    );
    // With --pids-by-node the nodes hold it: nothing to say.
    assert!(not_carried(&p, &opts()).is_empty());
    let mut o = opts();
    o.name = "Bad_Name".into();
    assert!(matches!(
        render(&plan(), &o),
        Err(KubeError::BadName { .. })
    ));
    let mut p = plan();
    p.network
        .allow_paths
        .push("GET api.github.com/repos/myorg/**".parse().unwrap());
    assert!(matches!(
        render(&p, &opts()),
        Err(KubeError::Unsupported { what }) if what.contains("by method and path")
    ));
    let mut p = plan();
    p.protected.push("/etc/elsewhere".into());
    assert!(matches!(
        render(&p, &opts()),
        Err(KubeError::OutsideProject { .. })
    ));
    // Under the home (the Pod's own emptyDir) there is nothing of the host's to protect: not
    // refused, and nothing is mounted there.
    let mut p = plan();
    p.protected.push("/home/dev/.pi/agent/bin".into());
    let yaml = to_yaml(&render(&p, &opts()).unwrap()).unwrap();
    assert!(!yaml.contains(".pi/agent"), "{yaml}");
}

#[test]
fn default_names_are_dns_labels() {
    assert_eq!(
        default_name(Path::new("/src/My_Project.rs")),
        "corral-my-project-rs"
    );
    let long = default_name(Path::new(
        "/src/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ));
    assert_eq!(long.len(), 40);
    assert!(valid_name(&long));
}

fn policies(objects: &[Object]) -> Vec<NetworkPolicy> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::NetworkPolicy(p) => Some((**p).clone()),
            _ => None,
        })
        .collect()
}

fn pod(name: &'static str, ip: &str, ns: &str, labels: BTreeMap<String, String>) -> Endpoint {
    Endpoint {
        name,
        ip: ip.parse().unwrap(),
        pod: Some(PodInfo {
            namespace: ns.into(),
            namespace_labels: BTreeMap::from([("kubernetes.io/metadata.name".into(), ns.into())]),
            labels,
        }),
    }
}

fn external(name: &'static str, ip: &str) -> Endpoint {
    Endpoint {
        name,
        ip: ip.parse::<IpAddr>().unwrap(),
        pod: None,
    }
}

/// The sandbox, the proxy, other Pods (one in another namespace wearing the sandbox's labels,
/// kube-dns) and addresses outside: public, private, metadata, IPv4 inside IPv6.
fn universe(o: &Options) -> Vec<Endpoint> {
    vec![
        pod("sandbox", "10.244.0.10", "agents", labels(o, "sandbox")),
        pod("proxy", "10.244.0.11", "agents", labels(o, "proxy")),
        pod("executor", "10.244.0.13", "agents", labels(o, "executor")),
        pod(
            "neighbour",
            "10.244.0.12",
            "agents",
            BTreeMap::from([("app".into(), "web".into())]),
        ),
        pod("impostor", "10.244.1.10", "evil", labels(o, "sandbox")),
        pod(
            "kube-dns",
            "10.244.2.2",
            "kube-system",
            BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
        ),
        pod(
            "kube-other",
            "10.244.2.3",
            "kube-system",
            BTreeMap::from([("k8s-app".into(), "metrics".into())]),
        ),
        external("public4", "1.1.1.1"),
        external("public6", "2606:4700::1111"),
        external("allowed-cidr", "10.20.3.4"),
        external("private", "192.168.1.1"),
        external("node", "10.0.0.5"),
        external("metadata", "169.254.169.254"),
        external("azure-wire", "168.63.129.16"),
        external("alibaba-meta", "100.100.100.200"),
        external("aws-meta6", "fd00:ec2::254"),
        external("mapped", "::ffff:10.0.0.5"),
        external("6to4-private", "2002:a00:5::1"),
        external("nat64", "64:ff9b::a00:5"),
    ]
}

const PORTS: [(&str, u16); 7] = [
    ("TCP", 22),
    ("UDP", 53),
    ("TCP", 53),
    ("TCP", 80),
    ("TCP", 443),
    ("TCP", 3128),
    ("TCP", 8080),
];

/// Every (source, destination, protocol, port) the policies allow, for sources in `from` or
/// destinations in `to`.
fn reach(
    pols: &[NetworkPolicy],
    o: &Options,
    side: impl Fn(&str, &str) -> bool,
) -> BTreeSet<String> {
    let u = universe(o);
    let mut out = BTreeSet::new();
    for s in u.iter().filter(|e| e.pod.is_some()) {
        for d in &u {
            if s.name == d.name || !side(s.name, d.name) {
                continue;
            }
            for (proto, port) in PORTS {
                if allowed(pols, s, d, proto, port) {
                    out.insert(format!("{} -> {} {proto}/{port}", s.name, d.name));
                }
            }
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_sandbox_reaches_only_the_proxy_port() {
    let o = opts();
    let pols = policies(&render(&plan(), &o).unwrap());
    similar_asserts::assert_eq!(
        reach(&pols, &o, |s, _| s == "sandbox"),
        set(&["sandbox -> proxy TCP/3128"])
    );
    // Control: without its policy the sandbox reaches everything.
    let open: Vec<_> = pols
        .iter()
        .filter(|p| !p.metadata.name.as_ref().unwrap().ends_with("-sandbox"))
        .cloned()
        .collect();
    assert!(reach(&open, &o, |s, _| s == "sandbox").contains("sandbox -> metadata TCP/80"));
}

#[test]
fn nothing_but_the_sandbox_reaches_the_proxy() {
    let o = opts();
    let pols = policies(&render(&plan(), &o).unwrap());
    similar_asserts::assert_eq!(
        reach(&pols, &o, |_, d| d == "proxy"),
        set(&["sandbox -> proxy TCP/3128"])
    );
    // Nothing at all reaches the sandbox.
    similar_asserts::assert_eq!(reach(&pols, &o, |_, d| d == "sandbox"), set(&[]));
}

#[test]
fn the_proxy_reaches_dns_public_addresses_and_allow_cidrs_only() {
    let o = opts();
    let pols = policies(&render(&plan(), &o).unwrap());
    let mut want = set(&["proxy -> kube-dns UDP/53", "proxy -> kube-dns TCP/53"]);
    for d in ["public4", "public6", "allowed-cidr"] {
        for (proto, port) in PORTS {
            want.insert(format!("proxy -> {d} {proto}/{port}"));
        }
    }
    similar_asserts::assert_eq!(reach(&pols, &o, |s, _| s == "proxy"), want);
}

#[test]
fn without_the_proxy_the_sandbox_reaches_nothing() {
    let mut p = plan();
    p.network.mode = NetworkMode::None;
    let o = opts();
    let objects = render(&p, &o).unwrap();
    assert!(
        !objects
            .iter()
            .any(|x| matches!(x, Object::Deployment(_) | Object::Service(_)))
    );
    similar_asserts::assert_eq!(
        reach(&policies(&objects), &o, |s, _| s == "sandbox"),
        set(&[])
    );
}

pub(crate) fn with_executor() -> (Plan, Options) {
    let mut p = plan();
    let mut jail = Plan::minimal(Path::new("/work/demo"), Path::new("/home/dev"), vec![]);
    jail.uid = 1000;
    jail.gid = 1000;
    jail.masked = p.masked.clone();
    jail.protected = p.protected.clone();
    jail.limits.memory = Some(2 << 30);
    p.executor.jail = Some(Box::new(jail));
    p.executor.allow = vec!["cargo".into()];
    let mut o = opts();
    o.executor = Some(ExecutorOptions {
        ip: "10.96.0.51".into(),
        image: "localhost/corral-pi:latest".into(),
        token: "0123456789abcdef0123456789abcdef".into(),
    });
    (p, o)
}

#[test]
fn renders_the_executor_whole() {
    let (p, o) = with_executor();
    let yaml = to_yaml(&render(&p, &o).unwrap()).unwrap();
    if std::env::var_os("CORRAL_BLESS").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/src/tests/jail-executor.yaml"),
            &yaml,
        )
        .unwrap();
    }
    similar_asserts::assert_eq!(yaml, include_str!("tests/jail-executor.yaml"));
    // Without --executor-ip it is left out, and said so.
    let mut o = o;
    o.executor = None;
    let objects = render(&p, &o).unwrap();
    assert!(!to_yaml(&objects).unwrap().contains("executor"));
    assert!(
        not_carried(&p, &o)
            .iter()
            .any(|n| n.contains("--executor-ip"))
    );
}

#[test]
fn only_the_sandbox_reaches_the_executor_which_reaches_nothing() {
    let (p, o) = with_executor();
    let pols = policies(&render(&p, &o).unwrap());
    similar_asserts::assert_eq!(
        reach(&pols, &o, |s, _| s == "sandbox"),
        set(&["sandbox -> executor TCP/8080", "sandbox -> proxy TCP/3128"])
    );
    similar_asserts::assert_eq!(
        reach(&pols, &o, |_, d| d == "executor"),
        set(&["sandbox -> executor TCP/8080"])
    );
    similar_asserts::assert_eq!(reach(&pols, &o, |s, _| s == "executor"), set(&[]));
    similar_asserts::assert_eq!(
        reach(&pols, &o, |_, d| d == "proxy"),
        set(&["sandbox -> proxy TCP/3128"])
    );
}

#[test]
fn an_executor_with_the_jails_rules_shares_the_proxy() {
    let (mut p, o) = with_executor();
    let net = p.network.clone();
    p.executor.jail.as_mut().unwrap().network = net;
    let pols = policies(&render(&p, &o).unwrap());
    similar_asserts::assert_eq!(
        reach(&pols, &o, |s, _| s == "executor"),
        set(&["executor -> proxy TCP/3128"])
    );
    similar_asserts::assert_eq!(
        reach(&pols, &o, |_, d| d == "proxy"),
        set(&["executor -> proxy TCP/3128", "sandbox -> proxy TCP/3128"])
    );
    // Other rules would need a second proxy: refused.
    p.executor.jail.as_mut().unwrap().network.allow.clear();
    assert!(matches!(render(&p, &o), Err(KubeError::Unsupported { .. })));
}

/// `--node-files` (podman kube play ignores subPath): no subPath anywhere, the masked and empty
/// files and the protected paths bound from the node, every volume named for the jail.
#[test]
fn node_files_render_without_sub_path() {
    let mut o = opts();
    o.project = ProjectSource::HostPath;
    o.node_files = Some(PathBuf::from("/var/lib/corral-node"));
    let objects = render(&plan(), &o).unwrap();
    let yaml = to_yaml(&objects).unwrap();
    assert!(!yaml.contains("subPath"), "{yaml}");
    let pod = objects
        .iter()
        .find_map(|o| match o {
            Object::Pod(p) => Some(p),
            _ => None,
        })
        .unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        pod.metadata.annotations,
        Some(BTreeMap::from([
            ("corral.dev/pids-limit-by-node".into(), "1024".into()),
            (
                "seccomp.security.alpha.kubernetes.io/pod".into(),
                "localhost/seccomp.json".into()
            ),
        ]))
    );
    let profile = spec
        .security_context
        .as_ref()
        .unwrap()
        .seccomp_profile
        .as_ref();
    assert_eq!(
        profile.and_then(|p| p.localhost_profile.as_deref()),
        Some("seccomp.json")
    );
    let vols = serde_yaml_ng::to_string(&spec.volumes).unwrap();
    let mounts = serde_yaml_ng::to_string(&spec.containers[0].volume_mounts).unwrap();
    similar_asserts::assert_eq!(
        vols,
        "\
- hostPath:
    path: /work/demo
    type: Directory
  name: project
- hostPath:
    path: /var/lib/corral-node/masked
    type: File
  name: corral-demo-masked
- hostPath:
    path: /var/lib/corral-node/empty
    type: File
  name: corral-demo-empty
- emptyDir: {}
  name: corral-demo-tmp
- emptyDir: {}
  name: corral-demo-private-0
- emptyDir: {}
  name: corral-demo-masked-1
- hostPath:
    path: /work/demo/.git/hooks
    type: File
  name: corral-demo-protected-1
"
    );
    similar_asserts::assert_eq!(
        mounts,
        "\
- mountPath: /work/demo
  name: project
  readOnly: false
- mountPath: /tmp
  name: corral-demo-tmp
  readOnly: false
- mountPath: /home/dev
  name: corral-demo-private-0
  readOnly: false
- mountPath: /work/demo/.env
  name: corral-demo-masked
  readOnly: true
- mountPath: /work/demo/secrets
  name: corral-demo-masked-1
  readOnly: true
- mountPath: /work/demo/corral.toml
  name: corral-demo-empty
  readOnly: true
- mountPath: /work/demo/.git/hooks
  name: corral-demo-protected-1
  readOnly: true
"
    );
    // Bound from the node's project: a claim cannot be.
    o.project = ProjectSource::Claim("demo-project".into());
    assert!(matches!(render(&plan(), &o), Err(KubeError::Bad { .. })));
}
