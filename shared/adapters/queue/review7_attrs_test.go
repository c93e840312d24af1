package queue_test

// Review 7 of 0700770..HEAD: SendMessage's attributes as a struct.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/holdfast/holdfast/shared/message"
)

// Held: the body sent is, byte for byte, what encoding/json wrote from the
// map the attributes were at 0700770, for a reservation and a transfer.
func TestReview7SendMessageBodyIsTheMapsToTheByte(t *testing.T) {
	for _, transfer := range []bool{false, true} {
		r := testRes
		r.Transfer = transfer
		standIn := &sqsStandIn{}
		srv := httptest.NewServer(standIn)
		creds := credentials.NewStaticCredentialsProvider("AKID", "secret", "")
		if err := direct(t, srv, creds, 1).Enqueue(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		body, err := message.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		type attributeValue struct {
			DataType    string `json:"DataType"`
			StringValue string `json:"StringValue"`
		}
		want, _ := json.Marshal(struct {
			QueueURL          string                    `json:"QueueUrl"`
			MessageBody       string                    `json:"MessageBody"`
			MessageAttributes map[string]attributeValue `json:"MessageAttributes"`
		}{srv.URL + "/000000000000/q", string(body), map[string]attributeValue{
			"type":    {DataType: "String", StringValue: message.TypeOf(r)},
			"version": {DataType: "Number", StringValue: strconv.Itoa(message.Version)},
		}})
		reqs := standIn.Requests()
		if len(reqs) != 1 || !bytes.Equal(reqs[0].Body, want) {
			t.Errorf("transfer %t: sent %q\nwant %q", transfer, reqs[0].Body, want)
		}
	}
}
