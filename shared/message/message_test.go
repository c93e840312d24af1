package message_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/message"
	"github.com/holdfast/holdfast/shared/reservation"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	in := reservation.Reservation{
		ID: "sku-1.aaaaaaaaaaaaaaaaaaaaaaaaaa", SKU: "sku-1", Qty: 3, UserID: "u", GroupID: "g-1",
		ExpiresAt: time.Date(2026, 11, 11, 0, 1, 0, 0, time.UTC), CreatedAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC),
	}
	body, err := message.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := message.Decode(body)
	if err != nil {
		t.Fatalf("Decode(%s) = %v", body, err)
	}
	in.Status = reservation.StatusHeld
	if out != in {
		t.Errorf("round trip = %+v, want %+v", out, in)
	}
}

func TestDecodeRejectsPoison(t *testing.T) {
	valid := `"version":1,"type":"ReservationHeld","reservation_id":"s.aaaaaaaaaaaaaaaaaaaaaaaaaa","sku":"s","user_id":"u"`
	for _, body := range []string{
		``, `null`, `[]`, `{`, `not json`,
		`{` + valid + `,"qty":0}`,
		`{` + valid + `,"qty":-1}`,
		`{` + valid + `,"qty":1.5}`,
		`{` + valid + `,"qty":99999999}`,
		`{` + valid + `,"qty":"1"}`,
		`{` + valid + `,"qty":1,"extra":true}`,
		`{` + valid + `,"qty":1}{}`,
		`{"version":2,"type":"ReservationHeld","reservation_id":"r-1","sku":"s","user_id":"u","qty":1}`,
		`{"version":1,"type":"Other","reservation_id":"r-1","sku":"s","user_id":"u","qty":1}`,
		`{"version":1,"type":"ReservationHeld","sku":"s","user_id":"u","qty":1}`,
		`{"version":1,"type":"ReservationHeld","reservation_id":"a{b}.aaaaaaaaaaaaaaaaaaaaaaaaaa","sku":"a{b}","user_id":"u","qty":1}`,
		`{"version":1,"type":"ReservationHeld","reservation_id":"t.aaaaaaaaaaaaaaaaaaaaaaaaaa","sku":"s","user_id":"u","qty":1}`,
		`{"version":1,"type":"ReservationHeld","reservation_id":"` + strings.Repeat("r", 65) + `","sku":"s","user_id":"u","qty":1}`,
	} {
		if _, err := message.Decode([]byte(body)); !errors.Is(err, message.ErrPoison) {
			t.Errorf("Decode(%q) = %v, want ErrPoison", body, err)
		}
	}
}

// FuzzDecode: any body either decodes to a valid reservation or is poison;
// it never panics. testdata/fuzz/FuzzDecode holds the corpus run in CI.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"type":"ReservationHeld","reservation_id":"s.aaaaaaaaaaaaaaaaaaaaaaaaaa","sku":"s","qty":1,"user_id":"u"}`))
	f.Add([]byte(`{"version":1,"type":"ReservationHeld","reservation_id":"r-1","sku":"s","qty":-1,"user_id":"u"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := message.Decode(body)
		if err != nil {
			if !errors.Is(err, message.ErrPoison) {
				t.Fatalf("Decode error %v is not ErrPoison", err)
			}
			return
		}
		if err := r.Validate(1_000_000); err != nil || r.ID == "" {
			t.Fatalf("Decode accepted an invalid reservation %+v: %v", r, err)
		}
	})
}
