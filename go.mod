module github.com/walcast/walcast

go 1.26

require (
	go.uber.org/goleak v1.3.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
