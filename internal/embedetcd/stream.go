package embedetcd

import (
	"context"
	"io"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// streamingKV is the KV client of a local client (Server.LocalClient):
// etcd's in-process adapter, which has no RangeStream, plus a RangeStream
// served in process. Without it a catalog listing falls back to ranges with
// a limit, each of which etcd answers with the count of every key left in
// the range: listing n keys costs O(n²) (a million collection names took
// minutes).
type streamingKV struct {
	pb.KVClient // the adapter
	srv         pb.KVServer
}

func newStreamingKV(srv pb.KVServer) streamingKV {
	return streamingKV{KVClient: adapter.KvServerToKvClient(srv), srv: srv}
}

// RangeStream runs the server's RangeStream on its own goroutine, its
// chunks passed to the returned client stream.
func (k streamingKV) RangeStream(ctx context.Context, in *pb.RangeRequest, _ ...grpc.CallOption) (pb.KV_RangeStreamClient, error) {
	ctx, cancel := context.WithCancel(ctx)
	s := &localStream{ctx: ctx, cancel: cancel, ch: make(chan *pb.RangeStreamResponse), done: make(chan struct{})}
	go func() {
		err := k.srv.RangeStream(in, serverSide{s})
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
	}()
	return clientSide{s}, nil
}

// localStream joins the two ends of an in-process RangeStream.
type localStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	ch     chan *pb.RangeStreamResponse
	done   chan struct{} // closed when the server's handler returned

	mu  sync.Mutex
	err error // the handler's; protected by mu
}

// serverSide is the stream the server's handler sends on.
type serverSide struct{ s *localStream }

func (v serverSide) Send(r *pb.RangeStreamResponse) error {
	select {
	case v.s.ch <- r:
		return nil
	case <-v.s.ctx.Done():
		return v.s.ctx.Err()
	}
}

func (v serverSide) Context() context.Context   { return v.s.ctx }
func (serverSide) SetHeader(metadata.MD) error  { return nil }
func (serverSide) SendHeader(metadata.MD) error { return nil }
func (serverSide) SetTrailer(metadata.MD)       {}
func (v serverSide) SendMsg(m any) error        { return v.Send(m.(*pb.RangeStreamResponse)) }
func (serverSide) RecvMsg(any) error            { return io.EOF }

// clientSide is the stream the client receives from.
type clientSide struct{ s *localStream }

func (v clientSide) Recv() (*pb.RangeStreamResponse, error) {
	select {
	case r := <-v.s.ch:
		return r, nil
	case <-v.s.done:
		// The handler returned: it sent every chunk it sent before.
		v.s.mu.Lock()
		err := v.s.err
		v.s.mu.Unlock()
		v.s.cancel()
		if err == nil {
			err = io.EOF
		}
		return nil, err
	case <-v.s.ctx.Done():
		return nil, v.s.ctx.Err()
	}
}

func (clientSide) Header() (metadata.MD, error) { return nil, nil }
func (clientSide) Trailer() metadata.MD         { return nil }
func (v clientSide) CloseSend() error           { return nil }
func (v clientSide) Context() context.Context   { return v.s.ctx }
func (clientSide) SendMsg(any) error            { return nil }
func (v clientSide) RecvMsg(m any) error {
	r, err := v.Recv()
	if err != nil {
		return err
	}
	out := m.(*pb.RangeStreamResponse)
	proto.Reset(out)
	proto.Merge(out, r)
	return nil
}
