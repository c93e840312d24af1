package loadgen

import "testing"

// INFO commandstats' calls are summed over every command but INFO (the
// reading's own), and the scripts apart.
func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hello:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n"
	all, scripts, err := commandStats(info)
	if err != nil || all != 16 || scripts != 13 {
		t.Errorf("commandStats = %d, %d, %v; want 16, 13", all, scripts, err)
	}
	if _, _, err := commandStats("cmdstat_get:calls=x\r\n"); err == nil {
		t.Error("a malformed count was read")
	}
}
