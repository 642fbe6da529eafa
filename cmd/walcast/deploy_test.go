package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	yaml "go.yaml.in/yaml/v3"

	"github.com/walcast/walcast/server"
)

// The deployment files of deploy/ (docs/operations.md) are checked here as
// far as this machine allows without a container engine or a Kubernetes
// API server: the binary the image ships is static, every walcast command
// line in them is a valid invocation whose configuration loads and
// validates, the Kubernetes manifests decode strictly into the fields they
// use and hang together (selectors, ports, probes, volumes, PDBs), and the
// NATS configuration parses with nats-server's own parser into a JetStream
// cluster member that syncs every write.

const deployDir = "../../deploy"

// TestDeployStaticBinary checks deploy/Dockerfile's build: CGO_ENABLED=0,
// trimmed paths, a distroless static base, and that the binary the tests
// run (built the same way, devcluster.BuildBinary) is static: no program
// interpreter, no shared library.
func TestDeployStaticBinary(t *testing.T) {
	df, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0 go build -trimpath", "./cmd/walcast", "FROM gcr.io/distroless/static-debian12:nonroot",
		`ENTRYPOINT ["/usr/local/bin/walcast"]`, "EXPOSE 7070 7071", "USER 65532:65532"} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("deploy/Dockerfile lacks %q", want)
		}
	}
	f, err := elf.Open(walcastBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the walcast binary has a program interpreter: it is not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the walcast binary needs shared libraries %v (%v)", libs, err)
	}
}

// checkCommandLine parses a walcast command line as the CLI does and loads
// its configuration: every flag must exist for that command and the
// configuration must validate. configs maps the --config path it names to
// a file of the repository.
func checkCommandLine(t *testing.T, where string, args []string, configs map[string]string) server.Config {
	t.Helper()
	root := newRoot()
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == root {
		t.Fatalf("%s: %v: not a walcast command (%v)", where, args, err)
	}
	for i, a := range rest {
		if a == "--config" && i+1 < len(rest) {
			file, ok := configs[rest[i+1]]
			if !ok {
				t.Fatalf("%s: --config %s is none of the files it mounts (%v)", where, rest[i+1], configs)
			}
			rest[i+1] = file
		}
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%s: walcast %s: %v", where, strings.Join(args, " "), err)
	}
	if cmd.Flags().NArg() > 0 {
		t.Fatalf("%s: stray arguments %v", where, cmd.Flags().Args())
	}
	path, _ := cmd.Flags().GetString("config")
	cfg, err := loadConfig(cmd.Flags(), path)
	if err != nil {
		t.Fatalf("%s: walcast %s: %v", where, strings.Join(args, " "), err)
	}
	if cmd.Name() == "node" {
		if ps, err := cfg.NodePChannels(); err != nil || len(ps) == 0 || len(cfg.Nodes.Coordinators) == 0 {
			t.Fatalf("%s: a node without pchannels or coordinators: %v %v", where, ps, err)
		}
	}
	return cfg
}

// compose is the part of a compose file this test reads.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		NetworkMode string            `yaml:"network_mode"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

// TestDeployCompose checks deploy/compose: the cluster of `walcast
// dev-cluster` (3 etcd members, 3 NATS servers, 2 coordinators, 2 nodes)
// on its ports; the walcast services' command lines; and nats.conf, parsed
// by nats-server for each server's environment: JetStream syncing every
// write, in a cluster with the three routes.
func TestDeployCompose(t *testing.T) {
	dir := filepath.Join(deployDir, "compose")
	b, err := os.ReadFile(filepath.Join(dir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range c.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"coord-0", "coord-1", "etcd-0", "etcd-1", "etcd-2", "nats-0", "nats-1", "nats-2", "node-0", "node-1"}; !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	var apis []string
	for _, name := range names {
		s := c.Services[name]
		if s.NetworkMode != "host" || s.Image == "" {
			t.Errorf("%s: image %q, network %q", name, s.Image, s.NetworkMode)
		}
		switch {
		case strings.HasPrefix(name, "coord"), strings.HasPrefix(name, "node"):
			configs := map[string]string{}
			for _, v := range s.Volumes {
				if src, dst, ok := strings.Cut(v, ":"); ok && strings.HasPrefix(src, "./") {
					dst, _, _ = strings.Cut(dst, ":")
					configs[dst] = filepath.Join(dir, src)
				}
			}
			cfg := checkCommandLine(t, "compose "+name, s.Command, configs)
			// Healthy once its /readyz passes, probed by the binary
			// itself (the image has no shell or curl).
			if want := []string{"CMD", "/usr/local/bin/walcast", "probe", "http://" + cfg.Metrics.Addr + "/readyz"}; !slices.Equal(s.Healthcheck.Test, want) {
				t.Errorf("%s: healthcheck %q, want %q", name, s.Healthcheck.Test, want)
			}
			if strings.HasPrefix(name, "coord") {
				apis = append(apis, cfg.API.Addr)
			}
			if cfg.WAL.NATS.Replicas != 3 {
				t.Errorf("%s: %d stream replicas", name, cfg.WAL.NATS.Replicas)
			}
		case strings.HasPrefix(name, "nats"):
			for k, v := range s.Environment {
				t.Setenv(k, v)
			}
			opts, err := natsserver.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
			if err != nil {
				t.Fatalf("%s: nats.conf: %v", name, err)
			}
			if opts.ServerName != name || !opts.JetStream || !opts.SyncAlways || opts.Cluster.Name == "" || len(opts.Routes) != 3 ||
				fmt.Sprint(opts.Port) != s.Environment["CLIENT_PORT"] || fmt.Sprint(opts.HTTPPort) != s.Environment["MONITOR_PORT"] || opts.Host != "127.0.0.1" {
				t.Errorf("%s: nats.conf gives %s port %d monitor %d jetstream %v sync always %v cluster %q routes %v",
					name, opts.ServerName, opts.Port, opts.HTTPPort, opts.JetStream, opts.SyncAlways, opts.Cluster.Name, opts.Routes)
			}
		}
	}
	if !slices.Equal(apis, []string{"127.0.0.1:27060", "127.0.0.1:27061"}) {
		t.Errorf("coordinator APIs %v: not the dev cluster's", apis)
	}
}

// TestDeploySystemd checks the systemd units: the sections and keys a unit
// needs, and their ExecStart lines as walcast command lines with the
// example configurations beside them.
func TestDeploySystemd(t *testing.T) {
	dir := filepath.Join(deployDir, "systemd")
	for unit, subst := range map[string]*strings.Replacer{
		"walcast-coord.service": strings.NewReplacer(),
		"walcast-node@.service": strings.NewReplacer("%i", "n0", "$NODE_ARGS", "--consume 0,2"),
	} {
		f, err := os.Open(filepath.Join(dir, unit))
		if err != nil {
			t.Fatal(err)
		}
		sections := map[string]map[string]string{}
		var cur string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case line == "" || strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
				cur = strings.Trim(line, "[]")
				sections[cur] = map[string]string{}
			case cur != "" && strings.Contains(line, "="):
				k, v, _ := strings.Cut(line, "=")
				sections[cur][k] = v
			default:
				t.Errorf("%s: line %q", unit, line)
			}
		}
		f.Close()
		svc := sections["Service"]
		if sections["Unit"] == nil || svc == nil || sections["Install"]["WantedBy"] != "multi-user.target" ||
			svc["User"] != "walcast" || svc["KillSignal"] != "SIGTERM" || svc["Restart"] != "always" || svc["Type"] != "notify" {
			t.Errorf("%s: sections %v", unit, sections)
		}
		exec := strings.Fields(subst.Replace(svc["ExecStart"]))
		if len(exec) < 2 || exec[0] != "/usr/local/bin/walcast" {
			t.Fatalf("%s: ExecStart %v", unit, exec)
		}
		checkCommandLine(t, unit, exec[1:], map[string]string{
			"/etc/walcast/coord.yaml": filepath.Join(dir, "coord.yaml"), "/etc/walcast/node.yaml": filepath.Join(dir, "node.yaml")})
	}
}

// Kubernetes objects, as far as the manifests use them. Decoding is strict:
// a field these types do not know (a misspelt readinessProbe, say) fails.
type (
	k8sObject struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
		Spec k8sSpec           `yaml:"spec"`
	}
	k8sSpec struct {
		Replicas             int              `yaml:"replicas"`
		ServiceName          string           `yaml:"serviceName"`
		PodManagementPolicy  string           `yaml:"podManagementPolicy"`
		ClusterIP            string           `yaml:"clusterIP"`
		MinAvailable         int              `yaml:"minAvailable"`
		MaxUnavailable       int              `yaml:"maxUnavailable"`
		Selector             k8sSelector      `yaml:"selector"`
		Ports                []k8sServicePort `yaml:"ports"`
		Strategy             map[string]any   `yaml:"strategy"`
		Template             k8sPodTemplate   `yaml:"template"`
		VolumeClaimTemplates []k8sClaim       `yaml:"volumeClaimTemplates"`
	}
	// k8sSelector is a Service's label map or a workload's matchLabels.
	k8sSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
		Labels      map[string]string `yaml:",inline"`
	}
	k8sServicePort struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort"`
	}
	k8sPodTemplate struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			EnableServiceLinks            *bool            `yaml:"enableServiceLinks"`
			TerminationGracePeriodSeconds int              `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               map[string]any   `yaml:"securityContext"`
			TopologySpreadConstraints     []map[string]any `yaml:"topologySpreadConstraints"`
			Containers                    []k8sContainer   `yaml:"containers"`
			Volumes                       []k8sVolume      `yaml:"volumes"`
		} `yaml:"spec"`
	}
	k8sContainer struct {
		Name  string   `yaml:"name"`
		Image string   `yaml:"image"`
		Args  []string `yaml:"args"`
		Env   []struct {
			Name      string `yaml:"name"`
			ValueFrom struct {
				FieldRef struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		LivenessProbe   *k8sProbe      `yaml:"livenessProbe"`
		ReadinessProbe  *k8sProbe      `yaml:"readinessProbe"`
		StartupProbe    *k8sProbe      `yaml:"startupProbe"`
		Resources       map[string]any `yaml:"resources"`
		SecurityContext map[string]any `yaml:"securityContext"`
		VolumeMounts    []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			SubPath   string `yaml:"subPath"`
			ReadOnly  bool   `yaml:"readOnly"`
		} `yaml:"volumeMounts"`
	}
	k8sProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
		PeriodSeconds    int `yaml:"periodSeconds"`
		FailureThreshold int `yaml:"failureThreshold"`
	}
	k8sVolume struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
		EmptyDir map[string]any `yaml:"emptyDir"`
	}
	k8sClaim struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec map[string]any `yaml:"spec"`
	}
)

// TestDeployKubernetes checks deploy/kubernetes: the objects decode
// strictly; the coordinators are a Deployment and the nodes a StatefulSet
// (with its headless Service and volume claims), each selected by its
// Service and its PodDisruptionBudget; every container probes /healthz
// (liveness) and /readyz (readiness) on a port it declares; every mount
// has its volume, every config subPath its ConfigMap key; the nodes'
// --group-size is the StatefulSet's replicas; and the containers' command
// lines, with the pod's name and IP filled in, load the ConfigMap's
// configurations.
func TestDeployKubernetes(t *testing.T) {
	dir := filepath.Join(deployDir, "kubernetes")
	var kust struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Resources  []string `yaml:"resources"`
		Images     []struct {
			Name    string `yaml:"name"`
			NewName string `yaml:"newName"`
			NewTag  string `yaml:"newTag"`
		} `yaml:"images"`
	}
	kb, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kd := yaml.NewDecoder(bytes.NewReader(kb))
	kd.KnownFields(true)
	if err := kd.Decode(&kust); err != nil || kust.Kind != "Kustomization" || len(kust.Resources) == 0 {
		t.Fatalf("kustomization: %+v, %v", kust, err)
	}
	objs := map[string]k8sObject{} // by kind/name
	for _, res := range kust.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			t.Fatal(err)
		}
		d := yaml.NewDecoder(bytes.NewReader(b))
		d.KnownFields(true)
		for {
			var o k8sObject
			err := d.Decode(&o)
			if err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s: %v", res, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: object without apiVersion, kind or name: %+v", res, o)
			}
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	want := []string{"ConfigMap/walcast-config", "Deployment/walcast-coord", "PodDisruptionBudget/walcast-coord", "PodDisruptionBudget/walcast-node",
		"Service/walcast", "Service/walcast-node", "StatefulSet/walcast-node"}
	var got []string
	for k := range objs {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("objects %v, want %v", got, want)
	}
	cm := objs["ConfigMap/walcast-config"]
	matches := func(sel, labels map[string]string) bool {
		if len(sel) == 0 {
			return false
		}
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	for _, name := range []string{"Deployment/walcast-coord", "StatefulSet/walcast-node"} {
		w := objs[name]
		pod := w.Spec.Template
		if !matches(w.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
			t.Errorf("%s: selector %v does not select its pods %v", name, w.Spec.Selector.MatchLabels, pod.Metadata.Labels)
		}
		if w.Spec.Replicas < 2 || pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks {
			t.Errorf("%s: %d replicas, enableServiceLinks %v", name, w.Spec.Replicas, pod.Spec.EnableServiceLinks)
		}
		svc := objs["Service/"+strings.TrimSuffix(strings.TrimPrefix(name, "Deployment/"), "-coord")]
		if strings.HasPrefix(name, "StatefulSet/") {
			svc = objs["Service/"+w.Spec.ServiceName]
			if svc.Spec.ClusterIP != "None" || len(w.Spec.VolumeClaimTemplates) == 0 {
				t.Errorf("%s: service %q not headless or no volume claims", name, w.Spec.ServiceName)
			}
		}
		if !matches(svc.Spec.Selector.Labels, pod.Metadata.Labels) {
			t.Errorf("%s: service %s selects %v, not its pods", name, svc.Metadata.Name, svc.Spec.Selector.Labels)
		}
		pdb := objs["PodDisruptionBudget/"+w.Metadata.Name]
		if !matches(pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels) || pdb.Spec.MinAvailable+pdb.Spec.MaxUnavailable != 1 {
			t.Errorf("%s: PodDisruptionBudget %+v", name, pdb.Spec)
		}
		volumes := map[string]k8sVolume{}
		for _, v := range pod.Spec.Volumes {
			volumes[v.Name] = v
		}
		for _, c := range w.Spec.VolumeClaimTemplates {
			volumes[c.Metadata.Name] = k8sVolume{Name: c.Metadata.Name}
		}
		for _, c := range pod.Spec.Containers {
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			for _, p := range svc.Spec.Ports {
				if !ports[p.TargetPort] {
					t.Errorf("%s: service port %s targets %q, which the container does not declare", name, p.Name, p.TargetPort)
				}
			}
			for probe, path := range map[*k8sProbe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
				if probe == nil || probe.HTTPGet.Path != path || !ports[probe.HTTPGet.Port] {
					t.Errorf("%s: probe %+v, want %s on a declared port", name, probe, path)
				}
			}
			configs := map[string]string{}
			for _, m := range c.VolumeMounts {
				v, ok := volumes[m.Name]
				if !ok {
					t.Errorf("%s: mount of unknown volume %s", name, m.Name)
					continue
				}
				if v.ConfigMap != nil {
					content, ok := cm.Data[m.SubPath]
					if v.ConfigMap.Name != cm.Metadata.Name || !ok {
						t.Errorf("%s: mount %s of %s/%s", name, m.MountPath, v.ConfigMap.Name, m.SubPath)
						continue
					}
					f := filepath.Join(t.TempDir(), m.SubPath)
					if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
						t.Fatal(err)
					}
					configs[m.MountPath] = f
				}
			}
			var args []string
			for _, a := range c.Args {
				args = append(args, strings.NewReplacer("$(POD_IP)", "10.1.2.3", "$(POD_NAME)", w.Metadata.Name+"-1").Replace(a))
			}
			cfg := checkCommandLine(t, name, args, configs)
			if strings.HasPrefix(name, "StatefulSet/") && cfg.Nodes.GroupSize != w.Spec.Replicas {
				t.Errorf("%s: --group-size %d, replicas %d", name, cfg.Nodes.GroupSize, w.Spec.Replicas)
			}
			if strings.HasPrefix(name, "Deployment/") && (cfg.API.Advertise != "10.1.2.3:7070" || cfg.API.TLS.CertFile == "" || !cfg.AuthOn()) {
				t.Errorf("%s: advertise %q, TLS %q, auth %v", name, cfg.API.Advertise, cfg.API.TLS.CertFile, cfg.AuthOn())
			}
		}
	}
}
