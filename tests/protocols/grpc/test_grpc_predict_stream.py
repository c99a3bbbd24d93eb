"""``PredictionService/PredictStreamed``: the request states of ``PredictStreamedOptions``.

``tensorflow-serving-api`` has no stub for the streaming RPC, so these use the
stubs generated from servekit's own protos; every example and incorrect example
of the proto's comments is one test.  The ``echo`` model returns its inputs, so a
response shows exactly what the pieces were joined into.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from grpc_support import shared_server
from servekit.codecs import tensor_proto
from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
    predict_pb2,
    prediction_service_pb2_grpc,
)

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

States = predict_pb2.PredictStreamedOptions
NONE, SPLIT, END_SPLIT, CANCEL = States.NONE, States.SPLIT, States.END_SPLIT, States.CANCEL


@pytest.fixture(scope="session")
def grpc_server(request, tmp_path_factory):
    return shared_server(request, tmp_path_factory)


@pytest.fixture(scope="session")
def stub(grpc_server):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.grpc_port}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def piece(state, model="echo", split=None, single=False, **tensors) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.predict_streamed_options.request_state = state
    request.predict_streamed_options.return_single_response = single
    for name, dim in (split or {}).items():
        request.predict_streamed_options.split_dimensions[name] = dim
    for name, value in tensors.items():
        tensor_proto.from_numpy(np.asarray(value), request.inputs[name])
    return request


def signature(request: predict_pb2.PredictRequest, name: str) -> predict_pb2.PredictRequest:
    request.model_spec.signature_name = name
    return request


def run(stub, *requests) -> list[dict[str, np.ndarray]]:
    responses = stub.PredictStreamed(iter(requests), timeout=30)
    return [{n: tensor_proto.to_numpy(t) for n, t in r.outputs.items()} for r in responses]


def refused(stub, *requests) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        run(stub, *requests)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value


X = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int32)


# -- the proto's examples -------------------------------------------------------------------


def test_example_1_none(stub):
    (out,) = run(stub, piece(NONE, x=X))
    np.testing.assert_array_equal(out["x"], X)


def test_example_2_lone_end_split(stub):
    (out,) = run(stub, piece(END_SPLIT, x=X))
    np.testing.assert_array_equal(out["x"], X)


def test_example_3_split_split_end_split(stub):
    split = {"x": 0}
    (out,) = run(
        stub,
        piece(SPLIT, split=split, x=[[1, 2]]),
        piece(SPLIT, split=split, x=[[3, 4]]),
        piece(END_SPLIT, split=split, x=[[5, 6]]),
    )
    np.testing.assert_array_equal(out["x"], [[1, 2], [3, 4], [5, 6]])


def test_example_4_two_end_splits_are_two_turns(stub):
    first, second = run(stub, piece(END_SPLIT, x=[1]), piece(END_SPLIT, x=[2]))
    assert first["x"].tolist() == [1] and second["x"].tolist() == [2]


def test_example_5_two_split_turns(stub):
    split = {"x": 0}
    first, second = run(
        stub,
        piece(SPLIT, split=split, x=[1]),
        piece(END_SPLIT, split=split, x=[2]),
        piece(SPLIT, split=split, x=[3]),
        piece(SPLIT, split=split, x=[4]),
        piece(END_SPLIT, split=split, x=[5]),
    )
    assert first["x"].tolist() == [1, 2]
    assert second["x"].tolist() == [3, 4, 5]


def test_incorrect_example_1_none_then_end_split(stub):
    err = refused(stub, piece(NONE, x=[1]), piece(END_SPLIT, x=[2]))
    assert "NONE" in err.details()


def test_incorrect_example_2_split_split_without_end_split(stub):
    err = refused(stub, piece(SPLIT, split={"x": 0}, x=[1]), piece(SPLIT, split={"x": 0}, x=[2]))
    assert "END_SPLIT" in err.details()


def test_incorrect_example_3_none_inside_splits(stub):
    refused(stub, piece(SPLIT, x=[1]), piece(NONE, x=[2]), piece(SPLIT, x=[3]), piece(END_SPLIT, x=[4]))


def test_incorrect_split_then_none(stub):
    refused(stub, piece(SPLIT, x=[1]), piece(NONE, x=[2]))


# -- split_dimensions -------------------------------------------------------------------------


def test_split_dimension_0(stub):
    # the proto's example; each piece keeps the tensor's rank
    (out,) = run(stub, piece(SPLIT, split={"x": 0}, x=X[:1]), piece(END_SPLIT, split={"x": 0}, x=X[1:]))
    np.testing.assert_array_equal(out["x"], X)


def test_split_dimension_1(stub):
    # the proto's example: [[1, 2], [5, 6]] and [[3, 4], [7, 8]]
    (out,) = run(stub, piece(SPLIT, split={"x": 1}, x=X[:, :2]), piece(END_SPLIT, split={"x": 1}, x=X[:, 2:]))
    np.testing.assert_array_equal(out["x"], X)


def test_inputs_not_split_come_from_the_first_piece(stub):
    (out,) = run(
        stub,
        piece(SPLIT, split={"x": 0}, x=[1], k=[10]),
        piece(END_SPLIT, split={"x": 0}, x=[2], k=[99]),
    )
    assert out["x"].tolist() == [1, 2]
    assert out["k"].tolist() == [10]


def test_split_map_may_come_with_any_piece(stub):
    (out,) = run(stub, piece(SPLIT, x=[1]), piece(END_SPLIT, split={"x": 0}, x=[2]))
    assert out["x"].tolist() == [1, 2]


def test_later_pieces_may_leave_model_spec_out(stub):
    second = piece(END_SPLIT, split={"x": 0}, x=[2])
    second.ClearField("model_spec")
    (out,) = run(stub, piece(SPLIT, split={"x": 0}, x=[1]), second)
    assert out["x"].tolist() == [1, 2]


def test_split_dimensions_are_ignored_for_none(stub):
    (out,) = run(stub, piece(NONE, split={"x": 5}, x=[1, 2]))
    assert out["x"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "pieces",
    [
        # dimension outside the rank
        [piece(SPLIT, split={"x": 2}, x=X), piece(END_SPLIT, split={"x": 2}, x=X)],
        [piece(SPLIT, split={"x": -1}, x=X), piece(END_SPLIT, split={"x": -1}, x=X)],
        # shapes that do not agree off the split dimension
        [piece(SPLIT, split={"x": 0}, x=[[1, 2]]), piece(END_SPLIT, split={"x": 0}, x=[[1, 2, 3]])],
        # a split input missing from a piece
        [piece(SPLIT, split={"x": 0}, x=[1]), piece(END_SPLIT, split={"x": 0}, y=[2])],
        # pieces that disagree on the dimension
        [piece(SPLIT, split={"x": 0}, x=X), piece(END_SPLIT, split={"x": 1}, x=X)],
        # dtypes that differ between pieces
        [
            piece(SPLIT, split={"x": 0}, x=np.array([1], np.int32)),
            piece(END_SPLIT, split={"x": 0}, x=np.array([1.0])),
        ],
        # pieces of one turn addressing different models
        [
            piece(SPLIT, split={"x": 0}, x=[1]),
            piece(END_SPLIT, model="iris", split={"x": 0}, x=[2]),
        ],
        # or different signatures
        [
            piece(SPLIT, split={"x": 0}, x=[1]),
            signature(piece(END_SPLIT, split={"x": 0}, x=[2]), "other"),
        ],
        # return_single_response changing within the stream
        [piece(END_SPLIT, x=[1]), piece(END_SPLIT, single=True, x=[2])],
    ],
    ids=[
        "dim-past-rank",
        "negative-dim",
        "shape-mismatch",
        "missing-input",
        "dims-disagree",
        "dtype-mismatch",
        "different-models",
        "different-signatures",
        "single-response-changes",
    ],
)
def test_invalid_splits(stub, pieces):
    refused(stub, *pieces)


def test_error_after_a_turn_keeps_the_earlier_response(stub):
    responses = stub.PredictStreamed(iter([piece(END_SPLIT, x=[1]), piece(NONE, x=[2])]), timeout=30)
    first = next(responses)
    assert tensor_proto.to_numpy(first.outputs["x"]).tolist() == [1]
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- CANCEL ------------------------------------------------------------------------------------


def test_cancel_drops_held_pieces_and_ends_the_stream(stub):
    # nothing after CANCEL runs, not even a request that would be refused
    out = run(
        stub,
        piece(SPLIT, split={"x": 0}, x=[1]),
        piece(CANCEL),
        piece(END_SPLIT, x=[2]),
        piece(NONE, x=[3]),
    )
    assert out == []


def test_cancel_after_a_turn(stub):
    out = run(stub, piece(END_SPLIT, x=[1]), piece(CANCEL), piece(END_SPLIT, x=[2]))
    assert [o["x"].tolist() for o in out] == [[1]]


def test_cancel_first(stub):
    assert run(stub, piece(CANCEL)) == []


# -- return_single_response ---------------------------------------------------------------------


def test_streaming_model_answers_per_item(stub):
    out = run(stub, piece(END_SPLIT, model="chunks", x=[[1], [2], [3]]))
    assert [o["y"].tolist() for o in out] == [[[2]], [[4]], [[6]]]


def test_return_single_response_joins_the_items(stub):
    (out,) = run(stub, piece(END_SPLIT, model="chunks", single=True, x=[[1], [2], [3]]))
    assert out["y"].tolist() == [[2], [4], [6]]


def test_responses_carry_the_effective_model_spec(stub):
    (response,) = stub.PredictStreamed(
        iter(
            [
                piece(
                    NONE,
                    model="iris",
                    sepal_length=[5.1],
                    sepal_width=[3.5],
                    petal_length=[1.4],
                    petal_width=[0.2],
                )
            ]
        ),
        timeout=30,
    )
    assert response.model_spec.name == "iris"
    assert response.model_spec.version.value == 2
    assert response.model_spec.signature_name == "serving_default"
    assert tensor_proto.to_numpy(response.outputs["predict"]).tolist() == [b"setosa"]


def test_model_errors_end_the_stream_with_their_status(stub):
    with pytest.raises(grpc.RpcError) as info:
        run(stub, piece(END_SPLIT, model="nope", x=[1]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
