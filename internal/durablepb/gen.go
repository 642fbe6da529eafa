// Package durablepb holds the generated protobuf types of walcast's durable
// formats (catalog records and WAL entries). Regenerate with `go generate
// ./internal/durablepb` (needs protoc and protoc-gen-go, see docs/development.md).
package durablepb

//go:generate protoc --proto_path=../../proto --go_out=../.. --go_opt=module=github.com/walcast/walcast walcast/durable/v1/durable.proto
