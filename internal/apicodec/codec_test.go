package apicodec

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestCodecKnowsEveryField fails when BroadcastResponse, Checkpoint or
// Outcome gains a field: appendBroadcastResponse must then write it and
// readBroadcastResponse read it.
func TestCodecKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		m    proto.Message
		want []protoreflect.FieldNumber
	}{
		{&walcastv1.BroadcastResponse{}, []protoreflect.FieldNumber{respBroadcastID, respAppends, respDuplicated, respOutcome, respWindow, respExtras}},
		{&walcastv1.Checkpoint{}, []protoreflect.FieldNumber{cpMessageID, cpTimeTick, cpLastConfirmed}},
		{&walcastv1.Outcome{}, []protoreflect.FieldNumber{outcomeStatus, outcomeDetail, outcomeData}},
	} {
		fs := c.m.ProtoReflect().Descriptor().Fields()
		var got []protoreflect.FieldNumber
		for i := range fs.Len() {
			got = append(got, fs.Get(i).Number())
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s has fields %v; this package writes and reads %v: teach write.go and read.go the new ones", c.m.ProtoReflect().Descriptor().FullName(), got, c.want)
		}
	}
}
