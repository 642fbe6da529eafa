package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployKubernetesMonitoring: deploy/kubernetes/monitoring.yaml's
// PodMonitor selects the pods of the coordinators' Deployment and the
// nodes' StatefulSet and scrapes the port they name metrics.
func TestDeployKubernetesMonitoring(t *testing.T) {
	dir := filepath.Join(deployDir, "kubernetes")
	b, err := os.ReadFile(filepath.Join(dir, "monitoring.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			PodMetricsEndpoints []struct {
				Port     string `yaml:"port"`
				Path     string `yaml:"path"`
				Interval string `yaml:"interval"`
			} `yaml:"podMetricsEndpoints"`
		} `yaml:"spec"`
	}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	if err := d.Decode(&pm); err != nil {
		t.Fatal(err)
	}
	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Kind != "PodMonitor" || len(pm.Spec.PodMetricsEndpoints) != 1 ||
		pm.Spec.PodMetricsEndpoints[0].Port != "metrics" || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" {
		t.Fatalf("monitoring.yaml: %+v", pm)
	}
	w, err := os.ReadFile(filepath.Join(dir, "walcast.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	wd := yaml.NewDecoder(bytes.NewReader(w))
	selected := 0
	for {
		var o k8sObject
		if err := wd.Decode(&o); err != nil {
			break
		}
		if o.Kind != "Deployment" && o.Kind != "StatefulSet" {
			continue
		}
		labels := o.Spec.Template.Metadata.Labels
		for k, v := range pm.Spec.Selector.MatchLabels {
			if labels[k] != v {
				t.Errorf("the PodMonitor does not select %s/%s (labels %v)", o.Kind, o.Metadata.Name, labels)
			}
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			if !slices.ContainsFunc(c.Ports, func(p struct {
				Name          string `yaml:"name"`
				ContainerPort int    `yaml:"containerPort"`
			}) bool {
				return p.Name == "metrics"
			}) {
				t.Errorf("%s/%s: container %s has no port named metrics", o.Kind, o.Metadata.Name, c.Name)
			}
		}
		selected++
	}
	if selected != 2 {
		t.Fatalf("found %d workloads, want the Deployment and the StatefulSet", selected)
	}
}

// TestDeployServerCertificate: `walcast auth cert ca` and `walcast auth cert
// create --server` write the files deploy/kubernetes's secrets take (ca.crt;
// api.crt and api.key for the walcast Service's names), and the server
// certificate verifies against the CA for those names.
func TestDeployServerCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, api := filepath.Join(dir, "ca"), filepath.Join(dir, "api")
	if _, err := run(t, "auth", "cert", "ca", "--out", ca); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "auth", "cert", "ca", "--out", ca); err == nil {
		t.Error("auth cert ca overwrote an existing CA")
	}
	if _, err := run(t, "auth", "cert", "create", "--ca-cert", ca+".crt", "--ca-key", ca+".key", "--server",
		"--host", "walcast", "--host", "walcast.walcast.svc", "--host", "10.0.0.5", "--out", api); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "auth", "cert", "create", "--ca-cert", ca+".crt", "--ca-key", ca+".key", "--server", "--out", api+"2"); err == nil {
		t.Error("a server certificate without --host was issued")
	}
	pair, err := tls.LoadX509KeyPair(api+".crt", api+".key")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(ca + ".crt")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	for _, name := range []string{"walcast", "walcast.walcast.svc", "10.0.0.5"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the server certificate for %s: %v", name, err)
		}
	}
}
