package meta

import "testing"

// TestImportJobShowsBytes: a running job's view carries its progress in
// bytes (files done plus the file being read, bounded by the total), which
// the CLI's bar and the console follow; a finished job has none.
func TestImportJobShowsBytes(t *testing.T) {
	j := jobRecord{ID: 1, Files: []string{"a.csv", "b.csv"}, State: jobPending}
	c := collRecord{ID: 2}
	p := &progressRecord{FilesDone: 1, RowsDone: 10, FileRows: 5, BytesDone: 100, FileBytes: 40, BytesTotal: 300}
	pb := jobView(j, p, c).pb()
	if pb.GetBytesDone() != 140 || pb.GetBytesTotal() != 300 || pb.GetRows() != 15 {
		t.Errorf("running job: %d of %d bytes, %d rows; want 140 of 300, 15", pb.GetBytesDone(), pb.GetBytesTotal(), pb.GetRows())
	}
	p.FileBytes = 1000 // a file that grew since the job started
	if pb := jobView(j, p, c).pb(); pb.GetBytesDone() != 300 {
		t.Errorf("bytes done past the total: %d", pb.GetBytesDone())
	}
	j.State = jobCompleted
	if pb := jobView(j, p, c).pb(); pb.GetBytesDone() != 0 || pb.GetBytesTotal() != 0 {
		t.Errorf("a finished job shows bytes: %v", pb)
	}
}
