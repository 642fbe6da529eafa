// Package walcastv1 holds the generated protobuf and Connect code of the
// walcast API (proto/walcast/api/v1). Regenerate with `go generate
// ./api/walcastv1` (needs protoc, protoc-gen-go and protoc-gen-connect-go;
// see docs/development.md).
package walcastv1

//go:generate protoc --proto_path=../../proto --go_out=../.. --go_opt=module=github.com/walcast/walcast --connect-go_out=../.. --connect-go_opt=module=github.com/walcast/walcast walcast/api/v1/broadcast.proto walcast/api/v1/meta.proto walcast/api/v1/replication.proto
