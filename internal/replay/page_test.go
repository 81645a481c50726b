package replay

import "testing"

func TestPageSize(t *testing.T) {
	tests := []struct {
		batch int
		rate  float64
		want  int
	}{
		{500, 0, 500},
		{500, 2000, 500},
		{500, 100, 100},
		{500, 0.5, 1},
		{50, 100, 50},
	}
	for _, tt := range tests {
		if got := pageSize(tt.batch, tt.rate); got != tt.want {
			t.Errorf("pageSize(%d, %g) = %d; want %d", tt.batch, tt.rate, got, tt.want)
		}
	}
}
