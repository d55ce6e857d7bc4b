"""Simulation model of the ECP5 ``MULT18X18D`` for Verilator and Icarus.

Yosys ships only a black box of this cell (``share/ecp5/cells_bb.v`` and
``share/lattice/cells_bb_ecp5.v``: no behaviour), and nextpnr none, so the project has its own
model. It covers the cell as :class:`npu.lib.ecp5_dsp.Mult18x18D` uses it and refuses other
settings at elaboration time (``$fatal``):

* ``P`` is the 36-bit product of ``A`` and ``B``, each 18 bits, sign-extended when
  ``SIGNEDA`` / ``SIGNEDB`` is high and zero-extended otherwise;
* the input registers (``REG_INPUTA_CLK``, ``REG_INPUTB_CLK``; each register also holds its
  operand's sign control), the pipeline register (``REG_PIPELINE_CLK``) and the output register
  (``REG_OUTPUT_CLK``) are each either bypassed (``"NONE"``) or clocked by ``CLK0`` with clock
  enable ``CE0`` and synchronous reset ``RST0`` (``RESETMODE="SYNC"``) to zero;
* the C input, the shift chains (``SOURCEA``/``SOURCEB`` must be low), the other clocks and
  ``MULT_BYPASS="ENABLED"`` are not modelled.

Port and parameter names are those of the Yosys black box;
``tests/sim/test_mac_ecp5.py`` checks them against the installed Yosys.
"""

__all__ = ["MULT18X18D_MODEL", "MODEL_PARAMETERS", "MODEL_PORTS"]


def _bits(name, width):
    return [f"{name}{i}" for i in range(width - 1, -1, -1)]


#: Ports of the model (a subset of the cell's), inputs then outputs.
MODEL_PORTS = (_bits("A", 18) + _bits("B", 18) + _bits("C", 18)
               + ["SIGNEDA", "SIGNEDB", "SOURCEA", "SOURCEB", "CLK0", "CE0", "RST0"]
               + _bits("P", 36))

#: Parameters of the model with their defaults (the cell's defaults).
MODEL_PARAMETERS = {
    "REG_INPUTA_CLK": "NONE", "REG_INPUTA_CE": "CE0", "REG_INPUTA_RST": "RST0",
    "REG_INPUTB_CLK": "NONE", "REG_INPUTB_CE": "CE0", "REG_INPUTB_RST": "RST0",
    "REG_INPUTC_CLK": "NONE", "REG_INPUTC_CE": "CE0", "REG_INPUTC_RST": "RST0",
    "REG_PIPELINE_CLK": "NONE", "REG_PIPELINE_CE": "CE0", "REG_PIPELINE_RST": "RST0",
    "REG_OUTPUT_CLK": "NONE", "REG_OUTPUT_CE": "CE0", "REG_OUTPUT_RST": "RST0",
    "CLK0_DIV": "ENABLED", "CLK1_DIV": "ENABLED", "CLK2_DIV": "ENABLED", "CLK3_DIV": "ENABLED",
    "HIGHSPEED_CLK": "NONE", "GSR": "ENABLED", "CAS_MATCH_REG": "FALSE",
    "SOURCEB_MODE": "B_SHIFT", "MULT_BYPASS": "DISABLED", "RESETMODE": "SYNC",
}


def _model():
    inputs = [p for p in MODEL_PORTS if not p.startswith("P")]
    outputs = [p for p in MODEL_PORTS if p.startswith("P")]
    lines = ["// MULT18X18D: model of the subset the project uses (npu_sim.ecp5_cells).",
             f"module MULT18X18D({', '.join(MODEL_PORTS)});"]
    lines += [f"  input {p};" for p in inputs]
    lines += [f"  output {p};" for p in outputs]
    lines += [f'  parameter {name} = "{value}";' for name, value in MODEL_PARAMETERS.items()]
    lines.append(f"  wire [17:0] a_in = {{{', '.join(_bits('A', 18))}}};")
    lines.append(f"  wire [17:0] b_in = {{{', '.join(_bits('B', 18))}}};")
    lines.append(r"""
  // Settings outside the modelled subset stop the simulation.
  initial begin
    if ((REG_INPUTA_CLK != "NONE" && REG_INPUTA_CLK != "CLK0")
        || (REG_INPUTB_CLK != "NONE" && REG_INPUTB_CLK != "CLK0")
        || (REG_PIPELINE_CLK != "NONE" && REG_PIPELINE_CLK != "CLK0")
        || (REG_OUTPUT_CLK != "NONE" && REG_OUTPUT_CLK != "CLK0")
        || REG_INPUTC_CLK != "NONE" || MULT_BYPASS != "DISABLED" || RESETMODE != "SYNC"
        || REG_INPUTA_CE != "CE0" || REG_INPUTB_CE != "CE0" || REG_PIPELINE_CE != "CE0"
        || REG_OUTPUT_CE != "CE0" || REG_INPUTA_RST != "RST0" || REG_INPUTB_RST != "RST0"
        || REG_PIPELINE_RST != "RST0" || REG_OUTPUT_RST != "RST0")
      $fatal(1, "MULT18X18D model: unsupported parameters");
  end

  // Input registers (each with its operand's sign control).
  reg [17:0] a_q = 18'd0, b_q = 18'd0;
  reg sa_q = 1'b0, sb_q = 1'b0;
  always @(posedge CLK0) begin
    if (RST0) begin
      a_q <= 18'd0; b_q <= 18'd0; sa_q <= 1'b0; sb_q <= 1'b0;
    end else if (CE0) begin
      a_q <= a_in; b_q <= b_in; sa_q <= SIGNEDA; sb_q <= SIGNEDB;
    end
  end
  wire [17:0] a_op = (REG_INPUTA_CLK == "CLK0") ? a_q : a_in;
  wire [17:0] b_op = (REG_INPUTB_CLK == "CLK0") ? b_q : b_in;
  wire sa_op = (REG_INPUTA_CLK == "CLK0") ? sa_q : SIGNEDA;
  wire sb_op = (REG_INPUTB_CLK == "CLK0") ? sb_q : SIGNEDB;

  // The product of the extended operands (36 bits are exact for either signedness).
  wire [35:0] a_ext = {{18{sa_op & a_op[17]}}, a_op};
  wire [35:0] b_ext = {{18{sb_op & b_op[17]}}, b_op};
  wire [35:0] product = a_ext * b_ext;

  // Pipeline and output registers.
  reg [35:0] pipe_q = 36'd0, out_q = 36'd0;
  wire [35:0] pipe_op = (REG_PIPELINE_CLK == "CLK0") ? pipe_q : product;
  always @(posedge CLK0) begin
    if (RST0) begin
      pipe_q <= 36'd0; out_q <= 36'd0;
    end else if (CE0) begin
      pipe_q <= product; out_q <= pipe_op;
    end
  end
  wire [35:0] p_out = (REG_OUTPUT_CLK == "CLK0") ? out_q : pipe_op;
""")
    lines.append(f"  assign {{{', '.join(_bits('P', 36))}}} = p_out;")
    lines.append("endmodule")
    return "\n".join(lines) + "\n"


#: Verilog text of the model.
MULT18X18D_MODEL = _model()
