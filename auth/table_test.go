package auth_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/walcast/walcast/api/walcastv1" // registers the API's descriptors
	"github.com/walcast/walcast/auth"
)

// introspection are the procedures of the gRPC health and reflection
// services a process serves beside the API (their generated descriptors
// are registered under other names, so they are listed here; the server's
// tests list what a running process serves, through reflection, and check
// every service against the table).
var introspection = []string{
	"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/List",
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}

// TestR9_8_EveryProcedureHasARole walks every service of the walcast API
// (every file of package walcast.api.v1 the generated code registers) and
// the introspection services, and fails if a method has no entry in the
// role table, so that a new RPC cannot be served without a decision on who
// may call it; and it fails on table entries no service has (a renamed RPC
// left behind).
func TestR9_8_EveryProcedureHasARole(t *testing.T) {
	table := auth.Procedures()
	seen := map[string]bool{}
	for _, p := range introspection {
		seen[p] = true
		if _, ok := table[p]; !ok {
			t.Errorf("%s has no role in auth's table", p)
		}
	}
	services := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("walcast.api.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			services++
			for j := range sd.Methods().Len() {
				proc := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				seen[proc] = true
				r, ok := table[proc]
				if !ok {
					t.Errorf("%s has no role in auth's table", proc)
					continue
				}
				if r == auth.NoRole {
					t.Errorf("%s has NoRole", proc)
				}
				if !auth.IsProcedure(proc) {
					t.Errorf("%s is not recognised as a procedure path", proc)
				}
			}
		}
		return true
	})
	if services < 3 {
		t.Fatalf("found %d services, want BroadcastService, MetaService and ReplicationService at least", services)
	}
	for proc := range table {
		if !seen[proc] {
			t.Errorf("table entry %s names no method of any service", proc)
		}
	}
}

// TestR9_8_RoleTable pins the SPEC's role classes: reader lists and shows,
// writer broadcasts and runs metadata DDL, admin retries and completes
// callbacks and drives replication, a node only acks.
func TestR9_8_RoleTable(t *testing.T) {
	want := map[string]auth.Role{
		"BroadcastService/Broadcast":        auth.Writer,
		"BroadcastService/Ack":              auth.Node,
		"BroadcastService/ListTasks":        auth.Reader,
		"BroadcastService/LookupKey":        auth.Reader,
		"BroadcastService/RetryCallback":    auth.Admin,
		"BroadcastService/CompleteCallback": auth.Admin,
		"MetaService/CreateCollection":      auth.Writer,
		"MetaService/GrantPrivilege":        auth.Admin,
		"MetaService/GetVChannelView":       auth.Reader,
		"ReplicationService/Follow":         auth.Admin,
		"ReplicationService/Configure":      auth.Admin,
		"ReplicationService/ForcePromote":   auth.Admin,
		"ReplicationService/Status":         auth.Reader,
	}
	for p, r := range want {
		got, ok := auth.Required("/walcast.api.v1." + p)
		if !ok || got != r {
			t.Errorf("%s: role %v (in table: %v), want %v", p, got, ok, r)
		}
	}
}

func TestRoleSatisfies(t *testing.T) {
	roles := []auth.Role{auth.NoRole, auth.Reader, auth.Writer, auth.Admin, auth.Node}
	// allowed[holder] lists the required roles the holder satisfies.
	allowed := map[auth.Role][]auth.Role{
		auth.NoRole: {auth.Public},
		auth.Reader: {auth.Public, auth.Reader},
		auth.Writer: {auth.Public, auth.Reader, auth.Writer},
		auth.Admin:  {auth.Public, auth.Reader, auth.Writer, auth.Admin, auth.Node},
		auth.Node:   {auth.Public, auth.Node},
	}
	for _, holder := range roles {
		for _, req := range append([]auth.Role{auth.Public}, roles...) {
			want := false
			for _, a := range allowed[holder] {
				want = want || a == req
			}
			if got := holder.Satisfies(req); got != want {
				t.Errorf("%v satisfies %v: %v, want %v", holder, req, got, want)
			}
		}
	}
	for _, s := range []string{"reader", "WRITER", "Admin", "node"} {
		if _, err := auth.ParseRole(s); err != nil {
			t.Errorf("ParseRole(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "public", "none", "root", "admin "} {
		if _, err := auth.ParseRole(s); err == nil {
			t.Errorf("ParseRole(%q) accepted", s)
		}
	}
}

func TestIsProcedure(t *testing.T) {
	for p, want := range map[string]bool{
		"/walcast.api.v1.BroadcastService/Broadcast":  true,
		"/walcast.api.v1.BroadcastService/Broadcast/": true, // malformed, but in the namespace: refused
		"/walcast.api.v1.BroadcastService/":           true,
		"/grpc.health.v1.Health/Check":                true,
		"/healthz":                                    false,
		"/favicon.ico":                                false,
		"/console/tasks":                              false,
		"/":                                           false,
	} {
		if got := auth.IsProcedure(p); got != want {
			t.Errorf("IsProcedure(%q) = %v, want %v", p, got, want)
		}
	}
	if strings.Contains(auth.NoRole.String(), "Role(") {
		t.Fatal("NoRole has no name")
	}
}
